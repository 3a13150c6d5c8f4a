"""The block family's fused sm90 forward convolution (statistics in the epilogue, then the
finalize and normalize kernels) on the layers it takes (32 output channels, input
channels in multiples of 32): stride 2, padding 0 and 2, dilation, 1x1x1 and
anisotropic kernels, samples that end inside a tile, GroupNorm and InstanceNorm, every
activation and position; against float64 and no further from it than eager's modules,
poisoned outputs, NCDHW and channels-last, bitwise repeatable. Every case asserts that
explain() names the fused path; layers it does not take name the fallback and why."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse.blocks import activation_of_module
from cutlassfuse.testing import ACTIVATION_MODULES, errors, poison_cuda_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.requires_sm90]

FLOOR = {torch.float16: 8e-3, torch.bfloat16: 6e-2}

# (in, out, kernel, stride, padding, dilation, size, num_groups (0: InstanceNorm), bias,
#  activation, before)
CASES = [
    (32, 32, 3, 1, 1, 1, (12, 13, 14), 0, True, "leaky_relu", False),
    (64, 32, 3, 1, 1, 1, (10, 9, 11), 0, False, "leaky_relu", False),
    (32, 32, 3, 2, 1, 1, (15, 16, 17), 0, True, "prelu_shared", False),
    (96, 32, 3, 1, 1, 1, (4, 8, 8), 8, True, "silu", False),
    (32, 32, 3, 1, 1, 1, (8, 8, 8), 8, True, "relu", True),
    (32, 32, (1, 3, 3), 1, (0, 1, 1), 1, (5, 9, 10), 4, True, "gelu", False),
    (32, 32, 3, 1, 2, 2, (9, 10, 11), 16, True, "prelu", True),
    (32, 32, 1, 1, 0, 1, (7, 6, 5), 2, True, "elu", True),
    (64, 32, 3, 2, 0, 1, (11, 12, 13), 32, True, "gelu_tanh", False),
    (32, 32, 3, 1, 1, 1, (6, 6, 6), 1, True, "identity", False),
]


def build(case, seed: int):
    cin, cout, kernel, stride, padding, dilation, _, groups, bias, activation, _ = case
    torch.manual_seed(seed)
    conv = nn.Conv3d(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation, bias=bias)
    norm = nn.InstanceNorm3d(cout, affine=True) if groups == 0 else nn.GroupNorm(groups, cout)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    act = ACTIVATION_MODULES[activation](cout)
    if isinstance(act, nn.PReLU):
        with torch.no_grad():
            act.weight.uniform_(0.05, 0.5)
    return [m.cuda().double() for m in (conv, norm, act)]


def run_block(x, conv, norm, act, before):
    name, parameter, weight = activation_of_module(act)
    num_groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else norm.num_features
    return cutlassfuse.conv3d_norm_activation(
        x, conv.weight, conv.bias, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
        num_groups=num_groups, norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps, activation=name,
        activation_parameter=parameter, activation_weight=weight, activation_before_norm=before)


def explain(x, conv, norm, act, before):
    """The path of a call keeping nothing for a backward."""
    name, _, weight = activation_of_module(act)
    num_groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else norm.num_features
    with torch.no_grad():
        return cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, conv.weight, stride=conv.stride,
                                         padding=conv.padding, dilation=conv.dilation, num_groups=num_groups,
                                         activation=name, activation_weight=weight, activation_before_norm=before)


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-k{c[2]}s{c[3]}p{c[4]}d{c[5]}-{c[9]}")
def test_fused_block_against_float64(case, dtype, channels_last):
    before = case[-1]
    seed = zlib.crc32(repr(case).encode())
    modules64 = build(case, seed)
    modules = [m.to(dtype) for m in build(case, seed)]
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, case[0], *case[6], device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    x = x.to(dtype).contiguous(memory_format=memory_format)
    path = explain(x, *modules, before)
    assert path.startswith("fused_sm90:"), path
    conv64, norm64, act64 = modules64
    conv, norm, act = modules
    with torch.no_grad():
        x64 = x.double()
        expected = norm64(act64(conv64(x64))) if before else act64(norm64(conv64(x64)))
        poison_cuda_allocator(16 * expected.numel() * x.element_size())
        out = run_block(x, *modules, before)
        again = run_block(x, *modules, before)
        reference = norm(act(conv(x))) if before else act(norm(conv(x)))
    assert out.shape == expected.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=memory_format)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"
    assert torch.equal(out, again), "two runs differ"


@pytest.mark.parametrize(("in_channels", "out_channels"), [(16, 32), (32, 64), (48, 32), (32, 16)])
def test_layers_the_tile_does_not_fit_take_the_fallback(in_channels, out_channels):
    case = (in_channels, out_channels, 3, 1, 1, 1, (6, 6, 6), 0, True, "relu", False)
    conv, norm, act = [m.half() for m in build(case, 5)]
    x = torch.randn(1, in_channels, 6, 6, 6, device="cuda", dtype=torch.float16)
    path = explain(x, conv, norm, act, False)
    assert path.startswith("fallback:") and "the fused convolution takes 32 output channels" in path, path


# Blocks the fused path keeps for a backward: InstanceNorm with and without the conv's
# bias (the bias moves only a one-channel group's mean), stride 2, GroupNorm without it.
KEEPING_CASES = [CASES[0], CASES[1], CASES[2], (32, 32, 3, 1, 1, 1, (8, 8, 8), 8, False, "silu", False)]


def explain_tracked(x, conv, norm, act, before):
    name, _, weight = activation_of_module(act)
    num_groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else norm.num_features
    return cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, conv.weight, conv.bias,
                                     stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                                     num_groups=num_groups, norm_weight=norm.weight, norm_bias=norm.bias,
                                     activation=name, activation_weight=weight, activation_before_norm=before)


def keeping_op_arguments(x, conv, norm, act) -> tuple:
    """The arguments of conv3d_norm_activation_for_backward for a Conv3d block."""
    num_groups = norm.num_groups if isinstance(norm, nn.GroupNorm) else norm.num_features
    return (x, conv.weight, conv.bias, conv.stride, conv.padding, (0, 0, 0), 1, conv.dilation, False, num_groups,
            norm.weight, norm.bias, norm.eps, *activation_of_module(act), False)


@pytest.mark.parametrize("fused_path", [True, False], ids=["fused", "fallback"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
def test_keeping_op_matches_its_fake_kernel(channels_last, fused_path):
    """The kept convolution output's layout (channels-last for 16-bit CUDA calls) is the
    fake kernel's, on both kernel paths."""
    conv, norm, act = [m.half() for m in build(CASES[0], 9)]
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, 32, 6, 7, 8, device="cuda", dtype=torch.float16).contiguous(memory_format=memory_format)
    arguments = keeping_op_arguments(x, conv, norm, act)
    with cutlassfuse.backends.flags(fused_path=fused_path):
        path = explain_tracked(x, conv, norm, act, False)
        assert path.startswith("fused_sm90:" if fused_path else "fallback:"), path
        torch.library.opcheck(torch.ops.cutlassfuse.conv3d_norm_activation_for_backward.default, arguments,
                              test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", KEEPING_CASES, ids=lambda c: f"{c[0]}-{c[1]}-s{c[3]}-g{c[7]}-bias{c[8]:d}-{c[9]}")
def test_grad_mode_call_keeps_the_conv_output_on_the_fused_path(case, dtype, channels_last):
    """In grad mode the fused convolution keeps its output without the bias, channels-last
    (the finalize and the normalize add the bias): the path says so, the output, the kept
    tensors and the gradients are within eager's error against float64, and the kept
    tensors are the fallback's within rounding, in the same layouts."""
    seed = zlib.crc32(repr(case).encode())
    modules64 = build(case, seed)
    modules = [m.to(dtype) for m in build(case, seed)]
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = torch.randn(2, case[0], *case[6], device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
    x = x.to(dtype).contiguous(memory_format=memory_format).requires_grad_()
    path = explain_tracked(x, *modules, False)
    assert path.startswith("fused_sm90:") and "keeping for its backward the convolution's output" in path, path
    with torch.no_grad():
        assert explain_tracked(x, *modules, False).startswith("fused_sm90:")

    conv64, norm64, act64 = modules64
    x64 = x.detach().double().requires_grad_()
    normalized = norm64(conv64(x64))
    expected = act64(normalized)
    # Zero where the activation's input is within 0.05 of a kink: a rounding to either
    # side there gives another gradient, eager's and ours alike.
    grad = torch.where(normalized.detach().abs() < 0.05, 0.0, torch.randn_like(expected))
    expected_grads = torch.autograd.grad(expected, [x64, *conv64.parameters(), *norm64.parameters()], grad)
    poison_cuda_allocator(16 * expected.numel() * x.element_size())
    out = run_block(x, *modules, False)
    assert out.grad_fn is not None and out.is_contiguous(memory_format=memory_format)
    conv, norm, act = modules
    reference = act(norm(conv(x)))
    ours, theirs = errors(out.detach(), expected), errors(reference.detach(), expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"

    leaves = [x, *conv.parameters(), *norm.parameters()]
    our_grads = torch.autograd.grad(out, leaves, grad.to(dtype))
    eager_grads = torch.autograd.grad(reference, leaves, grad.to(dtype))
    for name, ours, theirs, want in zip(["input", *(n for n, _ in conv.named_parameters()),
                                         *(n for n, _ in norm.named_parameters())],
                                        our_grads, eager_grads, expected_grads, strict=True):
        ours, theirs = errors(ours, want), errors(theirs, want)
        scale = want.abs().max().item()
        assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype] * scale), (
            f"{name}: cutlassfuse {ours}, eager {theirs}")

    arguments = keeping_op_arguments(x, conv, norm, act)
    with torch.no_grad():
        fused = torch.ops.cutlassfuse.conv3d_norm_activation_for_backward(*arguments)
        with cutlassfuse.backends.flags(fused_path=False):
            fallback = torch.ops.cutlassfuse.conv3d_norm_activation_for_backward(*arguments)
    assert fused[1].is_contiguous(memory_format=torch.channels_last_3d)
    for name, ours, theirs in zip(["out", "conv output", "mean", "rstd"], fused, fallback, strict=True):
        assert ours.shape == theirs.shape and ours.stride() == theirs.stride(), name
        tolerance = FLOOR[dtype] * max(theirs.abs().max().item(), 1.0)
        assert (ours.float() - theirs.float()).abs().max().item() <= tolerance, name


@pytest.mark.parametrize(("case", "reason"), [
    (CASES[3], "with a bias and GroupNorm groups of several channels"),
    (CASES[4], "with the activation before the norm"),
])
def test_grad_mode_calls_the_fused_path_cannot_keep_take_the_fallback(case, reason):
    conv, norm, act = [m.half() for m in build(case, 3)]
    x = torch.randn(1, case[0], 8, 8, 8, device="cuda", dtype=torch.float16)
    before = case[-1]
    assert explain(x, conv, norm, act, before).startswith("fused_sm90:")
    path = explain_tracked(x, conv, norm, act, before)
    assert path.startswith("fallback:") and reason in path, path
    out = run_block(x, conv, norm, act, before)
    assert out.grad_fn is not None
