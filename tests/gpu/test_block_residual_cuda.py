"""A block's residual (``act(norm(conv(x))) + residual``, MONAI's ResidualUnit) added by
the normalize as it writes the output, on the fused sm90 path and the fallback: every
normalize kernel (channels-last vectors and elements, NCDHW, NCDHW from channels-last
through the transpose, and the NCDHW output written beside a kept activation), the
residual in the output's layout and in the other one; against float64 and no further
from it than eager's modules plus the residual, poisoned outputs, bitwise repeatable;
the residual's gradient; the modules' PyTorch-add semantics for residuals that do not
fit the output; a network through fuse()."""

from __future__ import annotations

import copy
import zlib

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import ACTIVATION_MODULES, errors, poison_cuda_allocator

pytestmark = pytest.mark.gpu

# float32 convolves as PyTorch does under its switches (TF32 by default): eager's error.
FLOOR = {torch.float16: 8e-3, torch.bfloat16: 6e-2, torch.float32: 1e-4}

# (in, out, size, num_groups (0: InstanceNorm), activation, before): 32 -> 32 the fused
# path takes, 16 -> 24 (channels a multiple of 8) the fallback's vector kernels, 12 -> 20
# and an odd spatial size their element-wise ones.
CASES = [
    (32, 32, (8, 9, 10), 0, "prelu", False),
    (32, 32, (6, 6, 6), 8, "silu", True),
    (16, 24, (7, 8, 6), 0, "leaky_relu", False),
    (12, 20, (5, 7, 3), 4, "relu", False),
]


def build(case, dtype, seed: int):
    cin, cout, _, groups, activation, before = case
    torch.manual_seed(seed)
    conv = nn.Conv3d(cin, cout, 3, padding=1)
    norm = nn.InstanceNorm3d(cout, affine=True) if groups == 0 else nn.GroupNorm(groups, cout)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, ACTIVATION_MODULES[activation](cout),
                                                          activation_before_norm=before)
    return block.cuda().to(dtype)


def eager(block, x):
    conv, norm, act = block.conv, block.norm, block.activation
    return norm(act(conv(x))) if block.activation_before_norm else act(norm(conv(x)))


@pytest.mark.parametrize("residual_layout", ["same", "other"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("fused_path", [True, False], ids=["fused", "fallback"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-{c[4]}")
def test_residual_against_float64(case, fused_path, dtype, channels_last, residual_layout):
    seed = zlib.crc32(repr(case).encode())
    block, block64 = build(case, dtype, seed), build(case, torch.float64, seed)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    other_format = torch.contiguous_format if channels_last else torch.channels_last_3d
    generator = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(2, case[0], *case[2], device="cuda", generator=generator).to(dtype)
    x = x.contiguous(memory_format=memory_format)
    residual = torch.randn(2, case[1], *case[2], device="cuda", generator=generator).to(dtype)
    residual = residual.contiguous(memory_format=memory_format if residual_layout == "same" else other_format)
    with backends.flags(fused_path=fused_path), torch.no_grad():
        path = block.explain(x, residual=residual)
        assert "the residual added as the output is written" in path, path
        assert ("a copy of it in the output's layout first" in path) == (residual_layout == "other"), path
        if not fused_path or case[0] % 32 or case[1] % 32 or dtype == torch.float32:
            assert path.startswith("fallback:"), path
        elif torch.cuda.get_device_capability() == (9, 0):
            assert path.startswith("fused_sm90:"), path
        expected = eager(block64, x.double()) + residual.double()
        poison_cuda_allocator(16 * expected.numel() * x.element_size())
        out = block(x, residual=residual)
        again = block(x, residual=residual)
        reference = eager(block, x) + residual
    assert out.shape == expected.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=memory_format)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"
    assert torch.equal(out, again), "two runs differ"


@pytest.mark.parametrize("fused_path", [True, False], ids=["fused", "fallback"])
def test_residual_in_grad_mode_and_its_gradient(fused_path):
    """A call keeping for its backward adds the residual too (the output is written beside
    the kept convolution output); the residual's gradient is the output's."""
    block = build(CASES[0], torch.float16, 3)
    x = torch.randn(2, 32, 8, 9, 10, device="cuda", dtype=torch.float16, requires_grad=True)
    residual = torch.randn(2, 32, 8, 9, 10, device="cuda", dtype=torch.float16, requires_grad=True)
    with backends.flags(fused_path=fused_path):
        out = block(x, residual=residual)
        with torch.no_grad():
            plain = block(x)
        grad = torch.randn_like(out)
        out.backward(grad)
    # The sum rounded once against the block's output rounded, then added and rounded.
    torch.testing.assert_close(out.float(), plain.float() + residual.float(), rtol=1e-2, atol=1e-2)
    assert torch.equal(residual.grad, grad)
    assert x.grad is not None and all(p.grad is not None for p in block.parameters())


def test_residuals_that_do_not_fit_the_output_are_added_as_pytorch_adds():
    """The modules' residual is PyTorch's add where the op cannot take it: a broadcast
    shift, another dtype (type promotion)."""
    block = build(CASES[0], torch.float16, 4)
    x = torch.randn(2, 32, 8, 9, 10, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        plain = block(x)
        for residual in (torch.randn(1, 32, 1, 1, 1, device="cuda", dtype=torch.float16),
                         torch.randn(2, 32, 8, 9, 10, device="cuda", dtype=torch.float32)):
            out = block(x, residual=residual)
            assert out.dtype == torch.promote_types(plain.dtype, residual.dtype)
            assert torch.equal(out, plain + residual)


def test_unet_residual_units_add_in_the_normalize():
    """MONAI's UNet through fuse(): its ResidualUnits' adds become the blocks' residuals,
    one launch fewer each, and the output stays within eager's error against float64."""
    monai = pytest.importorskip("monai")
    torch.manual_seed(0)
    model = monai.networks.nets.UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=(16, 32, 64),
                                     strides=(2, 2), num_res_units=2).cuda().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model).half())
    assert len(result.residual_adds) >= 4, str(result)
    x = torch.rand(2, 1, 32, 32, 32, device="cuda")
    with torch.no_grad():
        expected = model.double()(x.double())
        ours = errors(result.model(x.half()), expected)
        theirs = errors(copy.deepcopy(model).half()(x.half()), expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[torch.float16]), f"fused {ours}, eager {theirs}"
