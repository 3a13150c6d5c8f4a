"""The block family on CUDA: every convolution kind x activation x position, GroupNorm
and InstanceNorm, with and without bias and affine, stride 1 and 2, NCDHW and
channels-last input, float16/bfloat16/float32, against float64 and no further from it
than eager's modules in the same dtype; the path taken (this project's kernels), poisoned
outputs, bitwise repeatability, grad mode, and the gradients: through the blocks, and
of the backward op (norm_activation_backward) alone, whose kernels the backward runs."""

from __future__ import annotations

import copy
import itertools
import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse import GroupNormActivation, backends
from cutlassfuse.blocks import ACTIVATIONS, activation_of_module
from cutlassfuse.testing import (
    ACTIVATION_MODULES,
    device_operations,
    errors,
    norm_activation_backward_by_autograd,
    poison_cuda_allocator,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Where eager's error is tiny (float32, or values that happen to round well), a few
# units in the last place of the output's dtype.
FLOOR = {torch.float16: 8e-3, torch.bfloat16: 6e-2, torch.float32: 2e-5}
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


def assert_block_no_further_from_float64_than_eager(x, modules, modules64, before, memory_format):
    """The block on poisoned outputs: x's dtype, the memory format, every element written,
    and no further from the float64 modules than eager's modules in x's dtype."""
    with torch.no_grad():
        expected = eager(x.double(), *modules64, before)
        poison_cuda_allocator(16 * expected.numel() * x.element_size())
        out = block(x, *modules, before)
        reference = eager(x, *modules, before)
    torch.cuda.synchronize()
    assert out.dtype == x.dtype and out.shape == expected.shape
    assert out.is_contiguous(memory_format=memory_format)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[x.dtype]), f"cutlassfuse {ours}, eager {theirs}"


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
    assert_block_no_further_from_float64_than_eager(x, modules, modules64, before, memory_format)


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


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_standalone_norm_of_a_2d_layer_runs_the_kernels(channels_last):
    """GroupNorm -> SiLU of a 2-D network (N, C, H, W) runs this project's kernels, as a
    5-D view, in both layouts, against float64."""
    norm64 = nn.GroupNorm(8, 32).cuda().double()
    with torch.no_grad():
        norm64.weight.uniform_(0.5, 1.5)
        norm64.bias.uniform_(-0.5, 0.5)
    x = (torch.randn(2, 32, 48, 40, device="cuda") * 3 + 1).half()
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    block = GroupNormActivation.from_modules(cast([norm64], torch.float16)[0], nn.SiLU())
    assert block.explain(x).startswith("norm:")
    with torch.no_grad():
        expected = F.silu(norm64(x.double()))
        out = block(x)
        reference = F.silu(F.group_norm(x, 8, block.norm.weight, block.norm.bias))
    # In the input's layout (ATen's CUDA GroupNorm returns NCHW for both).
    assert out.shape == x.shape and out.stride() == x.stride()
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[torch.float16]), f"cutlassfuse {ours}, eager {theirs}"


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


def away_from_kinks(grad: torch.Tensor, activation_input: torch.Tensor | None) -> torch.Tensor:
    """grad without the elements whose activation input (float64), where an activation
    after the norm reads it, lies within 0.05 of 0: ReLU's, LeakyReLU's, PReLU's and ELU's
    derivative jumps there, so a rounding of the input to either side gives another
    gradient (eager's in 16 bits, ours in float32 rarely); elsewhere one side is certain."""
    if activation_input is None:
        return grad
    return torch.where(activation_input.abs() < 0.05, torch.zeros_like(grad), grad)


# Every activation (and PReLU with one slope) x position x variant (GroupNorm with bias
# and affine, InstanceNorm without), the convolution's kind alternating.
GRADIENT_CASES = [(i % 2 == 1, activation, before, variant) for i, (activation, before, variant) in enumerate(
    itertools.product(ACTIVATION_MODULES, [False, True], range(len(VARIANTS))))]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("transposed", "activation", "before", "variant"), GRADIENT_CASES)
def test_gradients_against_float64(transposed, activation, before, variant, dtype, channels_last):
    seed = zlib.crc32(f"grad/{transposed}/{activation}/{before}/{variant}".encode())
    modules64 = cast(build(transposed, activation, VARIANTS[variant], seed), torch.float64)
    modules = cast(modules64, dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 8, 6, 5, 7, device="cuda", dtype=torch.float64).contiguous(memory_format=memory_format)
    grad = away_from_kinks(torch.randn_like(eager(x, *modules64, before)),
                           None if before else modules64[1](modules64[0](x)))

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


# Channel counts beside the powers of two: 12 (no 16-byte vectors of channels), 40 (five
# vectors a pixel), 72 (two channel tiles of the NCDHW-output transpose, the second one
# vector wide), 100 (two tiles, no vectors); pixels per sample a multiple of 8 and not.
CHANNEL_CASES = [(12, 4, (6, 5, 7)), (40, 8, (4, 4, 8)), (72, 8, (5, 3, 7)), (100, 10, (4, 6, 8))]


def channels_block(channels: int, num_groups: int, activation: str, seed: int):
    torch.manual_seed(seed)
    conv = nn.Conv3d(8, channels, 3, padding=1)
    norm = nn.GroupNorm(num_groups, channels)
    act = ACTIVATION_MODULES[activation](channels)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
        if activation == "prelu":
            act.weight.uniform_(0.05, 0.5)  # a slope of its own per channel
    return [m.cuda().double() for m in (conv, norm, act)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize(("channels", "num_groups", "size"), CHANNEL_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize(("activation", "before"), [("prelu", False), ("silu", True)])
def test_channel_counts_against_float64(activation, before, channels, num_groups, size, dtype, channels_last):
    """float16/bfloat16 calls with NCDHW input and nothing kept run the convolution on
    channels-last operands and write the output NCDHW from the normalize's transpose;
    channels-last calls normalize in place, a vector of channels per thread where the
    channels allow."""
    seed = zlib.crc32(f"channels/{channels}/{activation}".encode())
    modules64 = channels_block(channels, num_groups, activation, seed)
    modules = cast(modules64, dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 8, *size, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    x = x.to(dtype).contiguous(memory_format=memory_format)
    name, _, weight = activation_of_module(modules[2])
    path = cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, modules[0].weight, padding=1,
                                     num_groups=num_groups, activation=name, activation_weight=weight)
    assert path.startswith("fallback:"), path
    assert ("channels-last operands" in path) == (dtype != torch.float32 and not channels_last), path
    assert_block_no_further_from_float64_than_eager(x, modules, modules64, before, memory_format)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels", [12, 16, 72])
def test_ncdhw_output_equals_channels_last_output(channels, dtype):
    """An NCDHW input's call convolves the same channels-last operands as the channels-last
    input's (cuDNN's deterministic algorithms), so the normalize that transposes to NCDHW
    must give the very values the in-place channels-last normalize gives (the separate
    launches both: the channels-last call's tensor would fit the resident launch)."""
    modules = cast(channels_block(channels, 4, "prelu", 11), dtype)
    x = torch.randn(2, 8, 6, 4, 8, device="cuda", dtype=dtype)
    with torch.no_grad(), backends.flags(resident_norm=False):
        ncdhw = block(x, *modules, False)
        channels_last = block(x.contiguous(memory_format=torch.channels_last_3d), *modules, False)
    assert ncdhw.is_contiguous() and channels_last.is_contiguous(memory_format=torch.channels_last_3d)
    assert torch.equal(ncdhw, channels_last)


def misaligned_copy(x: torch.Tensor) -> torch.Tensor:
    """x's values, channels-last, at an address one element past a 16-byte boundary."""
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    strides = x.contiguous(memory_format=torch.channels_last_3d).stride()
    copy = storage[1:].as_strided(x.shape, strides)
    copy.copy_(x)
    return copy


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("activation", ["prelu", "gelu", "elu"])
def test_channels_last_vectors_equal_general_path(activation, dtype):
    """The channels-last normalize a vector of channels per thread (aligned tensors) and
    the general one (an input at an unaligned address) apply the same operations to
    each value: bitwise equal outputs."""
    channels = 48
    act = ACTIVATION_MODULES[activation](channels).cuda().to(dtype)
    if activation == "prelu":
        with torch.no_grad():
            act.weight.uniform_(0.05, 0.5)
    norm_weight = torch.rand(channels, device="cuda", dtype=dtype) + 0.5
    norm_bias = torch.rand(channels, device="cuda", dtype=dtype) - 0.5
    x = (torch.randn(2, channels, 9, 7, 8, device="cuda") * 2).to(dtype).contiguous(
        memory_format=torch.channels_last_3d)
    unaligned = misaligned_copy(x)
    assert unaligned.data_ptr() % 16 != 0 and unaligned.is_contiguous(memory_format=torch.channels_last_3d)
    name, parameter, weight = activation_of_module(act)

    def norm(input):
        return cutlassfuse.group_norm_activation(input, 6, norm_weight, norm_bias, activation=name,
                                                 activation_parameter=parameter, activation_weight=weight)

    with torch.no_grad():
        assert torch.equal(norm(x), norm(unaligned))


BACKWARD = torch.ops.cutlassfuse.norm_activation_backward.default
BACKWARD_RESULTS = ("conv_output", "norm_weight", "norm_bias", "bias", "activation_weight")
# (channels, num_groups, pixels): runs of four channels and 16-byte runs of an NCDHW
# plane's 240 pixels; one channel at a time (InstanceNorm), 105 pixels one at a time; then
# planes of two chunks, of whole 16-byte runs and not.
BACKWARD_SHAPES = [(16, 4, (8, 6, 5)), (6, 6, (5, 3, 7)), (4, 2, (16, 16, 12)), (3, 1, (17, 13, 11))]
# A gradient's max abs may exceed eager's by one rounding of the gradient itself.
GRADIENT_FLOOR = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 1e-5}


def float64(t):
    return None if t is None else t.double()


def backward_case(activation: str, before: bool, with_parameters: bool, shape: int, channels_last: bool,
                  dtype: torch.dtype, seed: int):
    """norm_activation_backward's inputs in `dtype` (bias, gamma with negatives and beta
    when `with_parameters`) and the activation module."""
    channels, num_groups, size = BACKWARD_SHAPES[shape]
    generator = torch.Generator("cuda").manual_seed(seed)

    def rand(*extents):
        return torch.randn(*extents, device="cuda", dtype=torch.float64, generator=generator)

    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    y = (rand(2, channels, *size) * 2 + 0.5).to(dtype).contiguous(memory_format=memory_format)
    bias = gamma = beta = None
    if with_parameters:
        signs = torch.ones(channels, device="cuda", dtype=torch.float64)
        signs[1::2] = -1
        bias, beta = rand(channels).to(dtype), (rand(channels) * 0.5).to(dtype)
        gamma = ((rand(channels) * 0.5 + 1) * signs).to(dtype)
    # Before the norm the activation reads y + bias, whose sign float32 gets right.
    z = y.double() if bias is None else y.double() + bias.double().view(1, -1, 1, 1, 1)
    normalized = None if before else torch.group_norm(z, num_groups, float64(gamma), float64(beta), 1e-5)
    dy = away_from_kinks(rand(2, channels, *size), normalized).to(dtype).contiguous(memory_format=memory_format)
    act = ACTIVATION_MODULES[activation](channels).cuda().to(dtype)
    return y, dy, bias, gamma, beta, num_groups, act


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("shape", range(len(BACKWARD_SHAPES)))
@pytest.mark.parametrize("with_parameters", [True, False], ids=["bias_affine", "plain"])
@pytest.mark.parametrize(("activation", "before"), list(itertools.product(ACTIVATION_MODULES, [False, True])))
def test_backward_op_against_float64(activation, before, with_parameters, shape, channels_last, dtype):
    """Each gradient of the backward op, from this project's kernels, no further from
    float64 than eager autograd's in the same dtype; the kernels write every element
    (poisoned memory), and repeat bit for bit."""
    seed = zlib.crc32(f"backward/{activation}/{before}/{with_parameters}/{shape}".encode())
    y, dy, bias, gamma, beta, num_groups, act = backward_case(activation, before, with_parameters, shape,
                                                              channels_last, dtype, seed)
    (mean, rstd), expected = norm_activation_backward_by_autograd(
        dy.double(), y.double(), float64(bias), float64(gamma), float64(beta), num_groups, 1e-5,
        copy.deepcopy(act).double(), before)
    _, theirs = norm_activation_backward_by_autograd(dy, y, bias, gamma, beta, num_groups, 1e-5, act, before)
    name, parameter, weight = activation_of_module(act)
    args = (dy, y, bias, mean.float(), rstd.float(), gamma, beta, num_groups, name, parameter,
            None if weight is None else weight.detach(), before)
    poison_cuda_allocator(8 * y.numel() * 4)
    ours = BACKWARD(*args)
    torch.cuda.synchronize()
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    assert ours[0].dtype == dtype and ours[0].is_contiguous(memory_format=memory_format)
    assert all(o.dtype == torch.float32 for o in ours[1:])
    for result, o, t, e in zip(BACKWARD_RESULTS, ours, theirs, expected, strict=True):
        assert o.shape == e.shape, result
        if e.numel() == 0:
            continue
        # The parameters' gradients are sums of y.numel() / e.numel() terms of about dy's
        # size each (a bias gradient of InstanceNorm is zero but for their rounding).
        terms = 1 if result == "conv_output" else y.numel() // e.numel()
        magnitude = max(e.abs().max().item(), math.sqrt(terms) * dy.abs().max().item() if terms > 1 else 0.0)
        error, eager_error = errors(o, e).max_abs, errors(t, e).max_abs
        floor = GRADIENT_FLOOR[dtype] * magnitude
        assert error <= 1.25 * eager_error + floor, f"{result}: {error:.3e} against eager's {eager_error:.3e}"
    for first, again in zip(ours, BACKWARD(*args), strict=True):
        assert torch.equal(first, again)


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
def test_backward_op_takes_any_gradient_layout(channels_last):
    """dy in the other layout, expanded or strided gives the results of the same values
    packed like y, dz in y's layout."""
    y, dy, bias, gamma, beta, num_groups, _ = backward_case("silu", False, True, 0, channels_last, torch.float16, 5)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    other = torch.contiguous_format if channels_last else torch.channels_last_3d
    statistics = torch.ones(2, num_groups, device="cuda")
    row = torch.randn(y.shape[-1], device="cuda", dtype=y.dtype)
    wide = torch.randn(*y.shape[:-1], 2 * y.shape[-1], device="cuda", dtype=y.dtype)
    for grad in (dy.contiguous(memory_format=other), row.expand(y.shape), wide[..., ::2]):
        got, want = (BACKWARD(g, y, bias, statistics, statistics, gamma, beta, num_groups, "silu", 0.0, None, False)
                     for g in (grad, grad.contiguous(memory_format=memory_format)))
        assert got[0].is_contiguous(memory_format=memory_format)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)


def cuda_kernel_names(profile) -> list[str]:
    return [e.name for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize(("activation", "before"), [("silu", False), ("prelu", True), ("leaky_relu", True)])
def test_training_step_runs_the_backward_kernels(activation, before, channels_last):
    """The block's backward and the standalone norm's run this project's kernels (sums,
    coefficients, grad, parameter gradients; rows channels-last, planes NCDHW), not
    ATen's GroupNorm backward: the 16-bit block's on its kept convolution output, which is
    channels-last whatever the input's layout, the norm's on its input's layout. The
    block's convolution gradients of an NCDHW input run on channels-last operands: this
    project's transposes of dy and the input, and of the input gradient back to NCDHW."""
    modules = cast(build(False, activation, VARIANTS[0], 11), torch.float16)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 8, 8, 8, 8, device="cuda", dtype=torch.float16).contiguous(memory_format=memory_format)
    norm = modules[1]
    name, parameter, weight = activation_of_module(modules[2])
    calls = [(lambda x: block(x, *modules, before), "rows"),
             (lambda x: cutlassfuse.group_norm_activation(x, 2, norm.weight[:8], norm.bias[:8], activation=name,
                                                          activation_parameter=parameter,
                                                          activation_weight=None if weight is None else weight[:8]),
              "rows" if channels_last else "planes")]
    for call, layout in calls:
        out = call(x.detach().requires_grad_())
        grad = torch.randn_like(out)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            out.backward(grad)
            torch.cuda.synchronize()
        names = cuda_kernel_names(profile)
        for kernel in (f"norm_activation_backward_sums_{layout}_kernel", "backward_coefficients_kernel",
                       f"norm_activation_backward_grad_{layout}_kernel", "parameter_grads_kernel"):
            assert sum(kernel in n for n in names) == 1, (kernel, names)
        assert not any("ComputeInternalGradients" in n or "GammaBetaBackward" in n for n in names), names
        if call is calls[0][0] and not channels_last:
            assert sum("ncdhw_to_ndhwc_kernel" in n for n in names) == 2, names
            assert sum("ndhwc_to_ncdhw_kernel" in n for n in names) == 1, names
            assert not any("nchwToNhwc" in n or "nhwcToNchw" in n for n in names), names


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("in_channels", [1, 3, 12])
def test_input_channels_padded_for_the_tensor_cores(in_channels, dtype, channels_last):
    """A 16-bit Conv3d whose input channels are not a multiple of 8 (a network's first
    layer) convolves zero-padded copies: the path says so, the values are eager's within
    its error against float64, in a call keeping nothing and in one keeping for its backward."""
    torch.manual_seed(in_channels)
    modules64 = [m.cuda().double() for m in (nn.Conv3d(in_channels, 16, 3, stride=2, padding=1),
                                             nn.InstanceNorm3d(16), nn.PReLU())]
    modules = cast(modules64, dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, in_channels, 20, 18, 17, device="cuda").to(dtype).contiguous(memory_format=memory_format)
    if in_channels == 1:  # its channels-last strides are NCDHW's too, and PyTorch's convolution writes NCDHW
        memory_format = torch.contiguous_format
    path = cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, modules[0].weight, stride=2, padding=1,
                                     num_groups=16, activation="prelu", activation_weight=modules[2].weight)
    assert path.startswith("fallback:") and "zero-padded to a multiple of 8" in path, path
    with torch.no_grad():
        names = device_operations(lambda: block(x, *modules, False))
    # The input and the weight padded in one pass each, no fill and copy of ATen's.
    assert sum("pad_channels_ndhwc_kernel" in n for n in names) == 2, names
    assert not any("FillFunctor" in n for n in names), names
    assert_block_no_further_from_float64_than_eager(x, modules, modules64, False, memory_format)
    tracked = block(x, *modules, False)
    assert tracked.grad_fn is not None
    with torch.no_grad():
        expected = eager(x.double(), *modules64, False)
        reference = eager(x, *modules, False)
    ours, theirs = errors(tracked.detach(), expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"


@pytest.mark.parametrize(("size", "kernel"), [((16, 16, 16), "normalize_channels_first_vectors_kernel"),
                                              ((15, 15, 15), "normalize_channels_first_kernel")])
def test_ncdhw_normalize_takes_16_byte_vectors_where_planes_hold_whole_ones(size, kernel):
    """The standalone norm's separate kernels on NCDHW input normalize with 16-byte
    accesses where every plane is a whole number of aligned vectors, one element a lane
    otherwise; both match eager's GroupNorm -> ReLU."""
    norm = nn.GroupNorm(4, 8).cuda().half()
    x = torch.randn(2, 8, *size, device="cuda").half()
    with (torch.no_grad(), backends.flags(resident_norm=False),
          torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile):
        out = cutlassfuse.group_norm_activation(x, 4, norm.weight, norm.bias, norm.eps, activation="relu")
        torch.cuda.synchronize()
    names = cuda_kernel_names(profile)
    assert sum(f"{kernel}<" in n for n in names) == 1, names
    expected = F.relu(F.group_norm(x.double(), 4, norm.weight.double(), norm.bias.double(), norm.eps))
    assert (out.double() - expected).abs().max().item() <= 1e-2
