"""The CUDA fallback (cuDNN's transposed convolution, then cutlassfuse's ReLU +
GroupNorm statistics and normalize kernels) on what the fused sm90 path does not take:
channel counts TMA cannot align, conv groups, NCDHW and channels-last, bias and affine
on and off, float16/bfloat16/float32 (float32 with TF32 off: within 1e-4 of float64, where
PyTorch's TF32 default lands ~3e-3 away); and, with the fused path turned off, what it
does take. Poisoned outputs, two runs bitwise equal."""

from __future__ import annotations

import zlib

import pytest
import torch

import cutlassfuse
from cutlassfuse.testing import errors, poison_cuda_allocator, reference_float64

# float32 is held to float64 and bitwise repeatable: PyTorch's strict, deterministic setting.
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

FP32_MAX_ABS = 1e-4
RELATIVE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
MAX_ABS = {torch.float16: 3e-2, torch.bfloat16: 2e-1}

# (name, batch, Cin, Cout, size, kernel, stride, padding, output_padding, conv groups, num_groups, bias, affine, CL)
CASES = [
    ("kb61_small", 4, 64, 128, (16, 16, 16), 3, 1, 0, 0, 1, 8, False, True, False),  # fused unless turned off
    ("odd_channels", 2, 3, 12, (5, 5, 5), 3, 1, 0, 0, 1, 4, True, True, False),
    ("odd_channels_strided", 2, 5, 6, (4, 6, 5), 4, 2, 1, 0, 1, 3, True, False, True),
    ("conv_groups", 2, 16, 32, (6, 6, 6), 3, 2, 1, 1, 4, 8, True, True, False),
    ("conv_groups_channels_last", 3, 24, 48, (5, 4, 6), 2, 2, 0, 0, 3, 6, False, True, True),
    ("group_per_channel", 2, 8, 10, (7, 3, 5), 3, 1, 1, 0, 1, 10, True, True, False),
]


def make_inputs(case, dtype):
    name, batch, cin, cout, size, k, stride, padding, output_padding, groups, num_groups, bias, affine, cl = case
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(f"{name}/{dtype}".encode()))
    x = torch.randn(batch, cin, *size, generator=g, device="cuda").to(dtype)
    if cl:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    w = (torch.randn(cin, cout // groups, k, k, k, generator=g, device="cuda") * (cin * k**3 / groups) ** -0.5)
    return dict(
        input=x, weight=w.to(dtype),
        bias=(0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype) if bias else None,
        stride=stride, padding=padding, output_padding=output_padding, groups=groups, num_groups=num_groups,
        norm_weight=(1 + 0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype) if affine else None,
        norm_bias=(0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype) if affine else None,
    )


def run_poisoned(inputs: dict, numel: int) -> torch.Tensor:
    poison_cuda_allocator(8 * numel * inputs["input"].element_size())
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    return out


@pytest.fixture(params=[True, False], ids=["as_dispatched", "fused_path_off"])
def fused_path(request):
    cutlassfuse.set_fused_path_enabled(request.param)
    yield request.param
    cutlassfuse.set_fused_path_enabled(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fallback_matches_float64(case, dtype, fused_path):
    inputs = make_inputs(case, dtype)
    path = cutlassfuse.explain(**inputs)
    if case[0] != "kb61_small" or not fused_path:
        assert path.startswith("fallback"), path
    reference = reference_float64(**inputs)
    out = run_poisoned(inputs, reference.numel())
    assert out.shape == reference.shape and out.dtype == dtype
    channels_last = inputs["input"].is_contiguous(memory_format=torch.channels_last_3d) and not inputs[
        "input"].is_contiguous()
    assert out.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference)
    if dtype == torch.float32:
        assert err.max_abs <= FP32_MAX_ABS, f"{err} via {path}"
    else:
        assert err.relative <= RELATIVE[dtype] and err.max_abs <= MAX_ABS[dtype], f"{err} via {path}"
    assert torch.equal(out, run_poisoned(inputs, reference.numel())), "two runs differ"


def test_fallback_propagates_nan_like_eager():
    inputs = make_inputs(CASES[1], torch.float32)
    inputs["input"][0, 0, 2, 2, 2] = float("nan")
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    expected = reference_float64(**inputs)
    assert torch.equal(out.isnan(), expected.isnan())


def test_fused_path_switch_sends_fused_shapes_to_the_fallback():
    inputs = make_inputs(CASES[0], torch.float16)  # kb61_small
    assert cutlassfuse.explain(**inputs).startswith("fused_sm90") or torch.cuda.get_device_capability() != (9, 0)
    fused = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    cutlassfuse.set_fused_path_enabled(False)
    try:
        assert cutlassfuse.explain(**inputs).startswith("fallback")
        fallback = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    finally:
        cutlassfuse.set_fused_path_enabled(True)
    reference = reference_float64(**inputs)
    assert errors(fallback, reference).relative <= RELATIVE[torch.float16]
    assert errors(fused, reference).relative <= RELATIVE[torch.float16]
