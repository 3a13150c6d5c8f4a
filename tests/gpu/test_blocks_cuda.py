"""The block family on CUDA: every convolution kind x activation x position, GroupNorm
and InstanceNorm, with and without bias and affine, stride 1 and 2, NCDHW and
channels-last input, float16/bfloat16/float32, against float64 and no further from it
than eager's modules in the same dtype; the path taken (this project's kernels), poisoned
outputs, bitwise repeatability, grad mode, and the gradients."""

from __future__ import annotations

import copy
import itertools
import zlib

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse.blocks import ACTIVATIONS, activation_of_module
from cutlassfuse.testing import errors, poison_cuda_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Where eager's error is tiny (float32, or values that happen to round well), a few
# units in the last place of the output's dtype.
FLOOR = {torch.float16: 8e-3, torch.bfloat16: 6e-2, torch.float32: 2e-5}
ACTIVATION_MODULES = {
    "identity": lambda c: nn.Identity(),
    "relu": lambda c: nn.ReLU(),
    "leaky_relu": lambda c: nn.LeakyReLU(0.1),
    "prelu": lambda c: nn.PReLU(c, init=0.2),
    "silu": lambda c: nn.SiLU(),
    "gelu": lambda c: nn.GELU(),
    "gelu_tanh": lambda c: nn.GELU(approximate="tanh"),
    "elu": lambda c: nn.ELU(0.7),
}
# (norm, num_groups, bias, affine, stride)
VARIANTS = [("group", 4, True, True, 1), ("instance", 16, False, False, 2)]


def build(transposed: bool, activation: str, variant, seed: int):
    norm_kind, num_groups, bias, affine, stride = variant
    torch.manual_seed(seed)
    conv_type = nn.ConvTranspose3d if transposed else nn.Conv3d
    extra = {"output_padding": stride - 1} if transposed else {}
    conv = conv_type(8, 16, 3, stride=stride, padding=1, bias=bias, **extra)
    norm = (nn.GroupNorm(num_groups, 16, affine=affine) if norm_kind == "group"
            else nn.InstanceNorm3d(16, affine=affine))
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    act = ACTIVATION_MODULES[activation](16)
    return [m.cuda() for m in (conv, norm, act)]


def block(x, conv, norm, act, before):
    name, parameter, weight = activation_of_module(act)
    num_groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else norm.num_features
    function = (cutlassfuse.conv_transpose3d_norm_activation if isinstance(conv, nn.ConvTranspose3d)
                else cutlassfuse.conv3d_norm_activation)
    extra = {"output_padding": conv.output_padding} if isinstance(conv, nn.ConvTranspose3d) else {}
    return function(x, conv.weight, conv.bias, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                    groups=conv.groups, num_groups=num_groups, norm_weight=norm.weight, norm_bias=norm.bias,
                    eps=norm.eps, activation=name, activation_parameter=parameter, activation_weight=weight,
                    activation_before_norm=before, **extra)


def eager(x, conv, norm, act, before):
    return norm(act(conv(x))) if before else act(norm(conv(x)))


def cast(modules, dtype):
    return [copy.deepcopy(m).to(dtype) for m in modules]


CASES = list(itertools.product([False, True], ACTIVATIONS, [False, True], range(len(VARIANTS))))


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("transposed", "activation", "before", "variant"), CASES)
def test_block_against_float64(transposed, activation, before, variant, dtype, channels_last):
    seed = zlib.crc32(f"{transposed}/{activation}/{before}/{variant}".encode())
    modules64 = cast(build(transposed, activation, VARIANTS[variant], seed), torch.float64)
    modules = cast(modules64, dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 8, 6, 5, 7, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    x = x.to(dtype).contiguous(memory_format=memory_format)
    name, *_ = activation_of_module(modules[2])
    assert cutlassfuse.explain_block(
        cutlassfuse.conv_transpose3d_norm_activation if transposed else cutlassfuse.conv3d_norm_activation,
        x, modules[0].weight, num_groups=4,
        **({"output_padding": modules[0].output_padding} if transposed else {}),
        stride=modules[0].stride, padding=modules[0].padding, activation=name,
        activation_weight=modules[2].weight if name == "prelu" else None).startswith("fallback:")
    with torch.no_grad():
        expected = eager(x.double(), *modules64, before)
        poison_cuda_allocator(16 * expected.numel() * x.element_size())
        out = block(x, *modules, before)
        reference = eager(x, *modules, before)
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == expected.shape
    assert out.is_contiguous(memory_format=memory_format)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("activation", "channels_last"), [("relu", False), ("silu", True), ("prelu", True),
                                                           ("leaky_relu", False)])
def test_standalone_norm_against_float64(activation, channels_last, dtype):
    norm64 = nn.GroupNorm(8, 16).cuda().double()
    with torch.no_grad():
        norm64.weight.uniform_(0.5, 1.5)
        norm64.bias.uniform_(-0.5, 0.5)
    act64 = ACTIVATION_MODULES[activation](16).cuda().double()
    norm, act = cast([norm64, act64], dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = (torch.randn(1, 16, 40, 33, 31, device="cuda") * 3 + 1).to(dtype).contiguous(memory_format=memory_format)
    name, parameter, weight = activation_of_module(act)
    assert cutlassfuse.explain_block(cutlassfuse.group_norm_activation, x, 8, activation=name,
                                     activation_weight=weight).startswith("norm:")
    with torch.no_grad():
        expected = act64(norm64(x.double()))
        poison_cuda_allocator(4 * x.numel() * x.element_size())
        out = cutlassfuse.group_norm_activation(x, 8, norm.weight, norm.bias, norm.eps, activation=name,
                                                activation_parameter=parameter, activation_weight=weight)
        reference = act(norm(x))
    assert out.is_contiguous(memory_format=memory_format)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"
    again = cutlassfuse.group_norm_activation(x, 8, norm.weight, norm.bias, norm.eps, activation=name,
                                              activation_parameter=parameter, activation_weight=weight)
    assert torch.equal(out, again)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("transposed", "activation", "before"),
                         [(False, "leaky_relu", False), (True, "prelu", False), (False, "silu", True)])
def test_repeatable_and_grad_mode_equal(transposed, activation, before, dtype):
    modules = cast(build(transposed, activation, VARIANTS[0], 7), dtype)
    x = torch.randn(2, 8, 9, 8, 7, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        first = block(x, *modules, before)
        second = block(x, *modules, before)
    tracked = block(x.requires_grad_(), *modules, before)
    assert tracked.grad_fn is not None
    assert torch.equal(first, second)
    assert torch.equal(first, tracked.detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("transposed", "activation", "before", "variant"),
                         [(False, "leaky_relu", False, 0), (True, "prelu", False, 1), (False, "silu", True, 0),
                          (False, "gelu", False, 1), (True, "elu", True, 0)])
def test_gradients_against_float64(transposed, activation, before, variant, dtype):
    seed = zlib.crc32(f"grad/{transposed}/{activation}".encode())
    modules64 = cast(build(transposed, activation, VARIANTS[variant], seed), torch.float64)
    modules = cast(modules64, dtype)
    x = torch.randn(2, 8, 6, 5, 7, device="cuda", dtype=torch.float64)
    grad = torch.randn_like(eager(x, *modules64, before))

    def gradients(function, mods, x):
        x = x.detach().requires_grad_()
        function(x, *mods, before).backward(grad.to(x.dtype))
        return [x.grad] + [p.grad for m in mods for p in m.parameters()]

    expected = gradients(eager, modules64, x)
    ours = gradients(block, modules, x.to(dtype))
    theirs = gradients(eager, cast(modules64, dtype), x.to(dtype))
    for o, t, e in zip(ours, theirs, expected, strict=True):
        scale = e.abs().max().item() + 1e-12
        ours_error, theirs_error = errors(o, e).max_abs / scale, errors(t, e).max_abs / scale
        assert ours_error <= max(1.25 * theirs_error, 10 * FLOOR[dtype]), (ours_error, theirs_error)
