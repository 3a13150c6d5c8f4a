"""The block family's ops on the CPU (the reference path): values against torch.nn's
modules in float64, gradients (gradcheck, double backward, the backward op against
autograd), fake kernels (opcheck, meta tensors) and argument validation."""

from __future__ import annotations

import itertools
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format

import cutlassfuse
from cutlassfuse.blocks import ACTIVATIONS, activation_of_module, as_five_d
from cutlassfuse.testing import ACTIVATION_MODULES, norm_activation_backward_by_autograd



def test_every_activation_has_a_module():
    assert set(ACTIVATION_MODULES) - {"prelu_shared"} == set(ACTIVATIONS)


def make_block(transposed: bool, activation: str, *, num_groups: int, bias: bool, affine: bool, stride: int,
               dtype=torch.float64):
    torch.manual_seed(0)
    conv_type = nn.ConvTranspose3d if transposed else nn.Conv3d
    extra = {"output_padding": stride - 1} if transposed else {}
    conv = conv_type(4, 6, 3, stride=stride, padding=1, bias=bias, dtype=dtype, **extra)
    norm = nn.GroupNorm(num_groups, 6, affine=affine, dtype=dtype)
    if affine:
        with torch.no_grad():
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    act = ACTIVATION_MODULES[activation](6).to(dtype)
    return conv, norm, act


def block_call(x, conv, norm, act, before: bool):
    name, parameter, weight = activation_of_module(act)
    function = (cutlassfuse.conv_transpose3d_norm_activation if isinstance(conv, nn.ConvTranspose3d)
                else cutlassfuse.conv3d_norm_activation)
    extra = {"output_padding": conv.output_padding} if isinstance(conv, nn.ConvTranspose3d) else {}
    return function(x, conv.weight, conv.bias, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                    groups=conv.groups, num_groups=norm.num_groups, norm_weight=norm.weight, norm_bias=norm.bias,
                    eps=norm.eps, activation=name, activation_parameter=parameter, activation_weight=weight,
                    activation_before_norm=before, **extra)


def eager(x, conv, norm, act, before: bool):
    return norm(act(conv(x))) if before else act(norm(conv(x)))


CASES = list(itertools.product([False, True], ACTIVATIONS, [False, True]))


@pytest.mark.parametrize(("transposed", "activation", "before"), CASES)
def test_block_matches_modules(transposed, activation, before):
    for num_groups, bias, affine, stride in [(2, True, True, 1), (6, False, False, 2)]:
        conv, norm, act = make_block(transposed, activation, num_groups=num_groups, bias=bias, affine=affine,
                                     stride=stride)
        x = torch.randn(2, 4, 5, 4, 6, dtype=torch.float64)
        torch.testing.assert_close(block_call(x, conv, norm, act, before), eager(x, conv, norm, act, before))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_standalone_norm_matches_modules(activation):
    norm = nn.GroupNorm(3, 6, dtype=torch.float64)
    act = ACTIVATION_MODULES[activation](6).to(torch.float64)
    x = torch.randn(2, 6, 3, 4, 5, dtype=torch.float64)
    name, parameter, weight = activation_of_module(act)
    out = cutlassfuse.group_norm_activation(x, 3, norm.weight, norm.bias, norm.eps, activation=name,
                                           activation_parameter=parameter, activation_weight=weight)
    torch.testing.assert_close(out, act(norm(x)))


@pytest.mark.parametrize("shape", [(3, 6), (3, 6, 7), (3, 6, 4, 5), (3, 6, 2, 3, 2, 2)], ids=["0d", "1d", "2d", "4d"])
def test_standalone_norm_takes_any_spatial_rank(shape):
    """As F.group_norm: (N, C, *), the output in the input's shape and (2-D) memory
    format; explain_block takes it too."""
    norm = nn.GroupNorm(3, 6, dtype=torch.float64)
    x = torch.randn(*shape, dtype=torch.float64)
    formats = [torch.contiguous_format, torch.channels_last] if len(shape) == 4 else [torch.contiguous_format]
    for memory_format in formats:
        x = x.contiguous(memory_format=memory_format)
        out = cutlassfuse.group_norm_activation(x, 3, norm.weight, norm.bias, activation="silu")
        expected = F.silu(norm(x))
        assert out.shape == expected.shape and out.stride() == expected.stride()
        torch.testing.assert_close(out, expected)
    assert cutlassfuse.explain_block(cutlassfuse.group_norm_activation, x, 3)
    with pytest.raises(ValueError, match=r"input must be \(N, C, \*\)"):
        cutlassfuse.group_norm_activation(torch.randn(6), 3)


def test_standalone_norm_keeps_a_batch_of_one_in_its_layout():
    """A 5-D input reaches the op, and its output the caller, as they are: a view restrides
    a batch of one, after which PyTorch reads a channels-last tensor as NCDHW (the op
    would convert the input; the next layers would read the output as NCDHW)."""
    x = torch.randn(1, 4, 3, 4, 5).contiguous(memory_format=torch.channels_last_3d)
    assert suggest_memory_format(as_five_d(x)) == torch.channels_last_3d
    assert suggest_memory_format(cutlassfuse.group_norm_activation(x, 2)) == torch.channels_last_3d
    block = cutlassfuse.GroupNormActivation.from_modules(nn.GroupNorm(2, 4), nn.SiLU())
    assert suggest_memory_format(block(x)) == torch.channels_last_3d


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d])
def test_output_memory_format_follows_the_input(memory_format):
    conv, norm, act = make_block(False, "relu", num_groups=2, bias=True, affine=True, stride=1)
    x = torch.randn(2, 4, 5, 4, 6, dtype=torch.float64).contiguous(memory_format=memory_format)
    assert block_call(x, conv, norm, act, False).is_contiguous(memory_format=memory_format)
    out = cutlassfuse.group_norm_activation(x, 2)
    assert out.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize(("transposed", "activation", "before"),
                         [(False, "prelu", False), (True, "silu", True), (False, "elu", True),
                          (True, "leaky_relu", False), (False, "gelu_tanh", False)])
def test_block_gradcheck(transposed, activation, before):
    conv, norm, act = make_block(transposed, activation, num_groups=2, bias=True, affine=True, stride=2)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    params = [p for m in (conv, norm, act) for p in m.parameters()]

    def f(x, *unused):
        return block_call(x, conv, norm, act, before)

    torch.autograd.gradcheck(f, (x, *params))


def test_block_double_backward():
    conv, norm, act = make_block(False, "silu", num_groups=2, bias=True, affine=True, stride=1)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradgradcheck(lambda x: block_call(x, conv, norm, act, False), (x,))


@pytest.mark.parametrize("activation", ["prelu", "gelu", "relu"])
def test_standalone_norm_gradcheck(activation):
    act = ACTIVATION_MODULES[activation](4).to(torch.float64)
    name, parameter, weight = activation_of_module(act)
    gamma = torch.rand(4, dtype=torch.float64, requires_grad=True)
    beta = torch.rand(4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 4, 3, 2, 3, dtype=torch.float64, requires_grad=True)

    def f(x, gamma, beta, *unused):
        return cutlassfuse.group_norm_activation(x, 2, gamma, beta, activation=name, activation_parameter=parameter,
                                                 activation_weight=weight)

    torch.autograd.gradcheck(f, (x, gamma, beta, *act.parameters()))
    torch.autograd.gradgradcheck(lambda x: f(x, gamma, beta), (x,))


def test_opcheck():
    conv, norm, act = make_block(True, "prelu", num_groups=2, bias=True, affine=True, stride=2)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    args = (x, conv.weight, conv.bias, [2, 2, 2], [1, 1, 1], [1, 1, 1], 1, [1, 1, 1], True, 2, norm.weight,
            norm.bias, 1e-5, "prelu", 0.0, act.weight, False)
    torch.library.opcheck(torch.ops.cutlassfuse.conv3d_norm_activation.default, args)
    torch.library.opcheck(torch.ops.cutlassfuse.group_norm_activation.default,
                          (torch.randn(2, 6, 3, 3, 3, requires_grad=True), 3, None, None, 1e-5, "silu", 0.0, None))


def test_explain_follows_grad_mode(monkeypatch):
    """explain_block and the module's explain ask the op keeping for a backward exactly
    when the call would be differentiated."""
    conv, norm, act = nn.Conv3d(4, 6, 3), nn.GroupNorm(3, 6), nn.SiLU()
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, act)
    x = torch.randn(1, 4, 5, 5, 5)
    asked = []
    for name in ("explain_conv3d_norm_activation", "explain_conv3d_norm_activation_for_backward"):
        op = getattr(torch.ops.cutlassfuse, name)
        monkeypatch.setattr(torch.ops.cutlassfuse, name,
                            lambda *args, op=op, name=name: asked.append(name) or op(*args))

    def explain_both():
        assert cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, conv.weight, conv.bias,
                                         num_groups=3).startswith("reference")
        assert block.explain(x).startswith("reference")

    explain_both()
    with torch.no_grad():
        explain_both()
    block.requires_grad_(False)
    explain_both()
    assert asked == ["explain_conv3d_norm_activation_for_backward"] * 2 + ["explain_conv3d_norm_activation"] * 4


def test_meta_tensors():
    x = torch.empty(2, 4, 8, 8, 8, device="meta").contiguous(memory_format=torch.channels_last_3d)
    w = torch.empty(6, 4, 3, 3, 3, device="meta")
    out = cutlassfuse.conv3d_norm_activation(x, w, stride=2, padding=1, num_groups=6, activation="silu")
    assert out.shape == (2, 6, 4, 4, 4) and out.device.type == "meta"
    assert out.is_contiguous(memory_format=torch.channels_last_3d)
    assert "meta" in cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, w, num_groups=6)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"activation": "relu6"}, ValueError, "unknown activation"),
    ({"activation": "prelu"}, ValueError, "needs activation_weight"),
    ({"activation_weight": torch.ones(1)}, ValueError, "takes none"),
    ({"activation": "prelu", "activation_weight": torch.ones(5)}, ValueError, "activation_weight must have shape"),
    ({"num_groups": 4}, ValueError, "num_groups"),
    ({"activation_parameter": float("nan")}, ValueError, "activation_parameter must be finite"),
    ({"norm_weight": torch.ones(5)}, ValueError, "norm_weight must have shape"),
])
def test_invalid_arguments_raise_before_running(kwargs, error, message):
    x = torch.randn(1, 4, 5, 5, 5)
    w = torch.randn(6, 4, 3, 3, 3)
    arguments = {"num_groups": 2, **kwargs}
    for device in ("cpu", "meta"):
        with pytest.raises(error, match=message):
            cutlassfuse.conv3d_norm_activation(x.to(device), w.to(device), **{
                k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in arguments.items()})


def test_conv3d_rejects_output_padding_and_mismatched_channels():
    x = torch.randn(1, 4, 5, 5, 5)
    with pytest.raises(ValueError, match="output_padding is a transposed convolution's"):
        torch.ops.cutlassfuse.conv3d_norm_activation(x, torch.randn(6, 4, 3, 3, 3), None, [1] * 3, [0] * 3, [1] * 3,
                                                     1, [1] * 3, False, 2, None, None, 1e-5, "relu", 0.0, None, False)
    with pytest.raises(ValueError, match=r"weight.shape\[1\] \* groups"):
        cutlassfuse.conv3d_norm_activation(x, torch.randn(6, 3, 3, 3, 3), num_groups=2)
    with pytest.raises(ValueError, match="output would be empty"):
        cutlassfuse.conv3d_norm_activation(x, torch.randn(6, 4, 7, 3, 3), num_groups=2)


@pytest.mark.parametrize(("packed", "error", "message"), [
    (lambda w: w.permute(0, 2, 3, 4, 1).contiguous(), ValueError, "packed_weight must have weight's shape"),
    (lambda w: w.double().contiguous(memory_format=torch.channels_last_3d), TypeError,
     "packed_weight must have weight's dtype"),
    (lambda w: w.clone(), ValueError, "packed_weight must be channels_last_3d"),
])
def test_packed_weight_must_be_the_weight_channels_last(packed, error, message):
    """The op's packed_weight, which the block modules pass (their kept copy of the weight)."""
    x = torch.randn(1, 4, 5, 5, 5)
    w = torch.randn(6, 4, 3, 3, 3)
    for device in ("cpu", "meta"):
        xd, wd = x.to(device), w.to(device)
        with pytest.raises(error, match=message):
            torch.ops.cutlassfuse.conv3d_norm_activation(xd, wd, None, [1] * 3, [0] * 3, [0] * 3, 1, [1] * 3, False, 2,
                                                         None, None, 1e-5, "relu", 0.0, None, False, packed(wd))


def test_packed_weight_changes_nothing_on_the_cpu():
    """The reference reads the weight; a valid packed copy gives the same output."""
    x = torch.randn(1, 4, 5, 5, 5)
    w = torch.randn(6, 4, 3, 3, 3)
    arguments = [x, w, None, [1] * 3, [1] * 3, [0] * 3, 1, [1] * 3, False, 2, None, None, 1e-5, "silu", 0.0, None,
                 False]
    packed = w.contiguous(memory_format=torch.channels_last_3d)
    op = torch.ops.cutlassfuse.conv3d_norm_activation
    assert torch.equal(op(*arguments, packed), op(*arguments))


@pytest.mark.parametrize(("transposed", "activation", "before"),
                         [(False, "prelu", False), (True, "silu", True), (False, "leaky_relu", False)])
@pytest.mark.parametrize("residual_format", [torch.contiguous_format, torch.channels_last_3d], ids=["ncdhw", "cl"])
def test_residual_is_added_to_the_output(transposed, activation, before, residual_format):
    """act(norm(conv(x))) + residual (MONAI's ResidualUnit), the residual in either layout;
    the output keeps the input's layout."""
    conv, norm, act = make_block(transposed, activation, num_groups=2, bias=True, affine=True, stride=2)
    x = torch.randn(2, 4, 3, 4, 3, dtype=torch.float64)
    expected = eager(x, conv, norm, act, before)
    residual = torch.randn_like(expected).contiguous(memory_format=residual_format)
    name, parameter, weight = activation_of_module(act)
    function = cutlassfuse.conv_transpose3d_norm_activation if transposed else cutlassfuse.conv3d_norm_activation
    extra = {"output_padding": conv.output_padding} if transposed else {}
    out = function(x, conv.weight, conv.bias, stride=conv.stride, padding=conv.padding, num_groups=2,
                   norm_weight=norm.weight, norm_bias=norm.bias, activation=name, activation_parameter=parameter,
                   activation_weight=weight, activation_before_norm=before, residual=residual, **extra)
    torch.testing.assert_close(out, expected + residual)
    assert out.is_contiguous()
    block_type = cutlassfuse.ConvTranspose3dNormActivation if transposed else cutlassfuse.Conv3dNormActivation
    block = block_type.from_modules(conv, norm, act, activation_before_norm=before)
    torch.testing.assert_close(block(x, residual=residual), expected + residual)


def test_residual_gradcheck():
    """The residual's gradient is the output's; the others are the block's."""
    conv, norm, act = make_block(False, "prelu", num_groups=2, bias=True, affine=True, stride=1)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(1, 6, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, act)

    def f(x, residual, *unused):
        return block(x, residual=residual)

    torch.autograd.gradcheck(f, (x, residual, *block.parameters()))
    torch.autograd.gradgradcheck(lambda x, residual: block(x, residual=residual), (x, residual))


def test_residual_gradient_beside_a_packed_weight():
    """The packed weight (no gradient) and the residual both given: each gradient reaches
    its own input."""
    conv, norm, act = make_block(False, "relu", num_groups=2, bias=True, affine=True, stride=1)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(1, 6, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    packed = conv.weight.detach().contiguous(memory_format=torch.channels_last_3d)

    def f(x, residual, weight):
        return torch.ops.cutlassfuse.conv3d_norm_activation(
            x, weight, conv.bias, [1, 1, 1], [1, 1, 1], [0, 0, 0], 1, [1, 1, 1], False, 2, norm.weight, norm.bias,
            1e-5, "relu", 0.0, None, False, packed, residual)

    torch.autograd.gradcheck(f, (x, residual, conv.weight))


def test_the_graph_does_not_keep_the_residual():
    """The backward needs only whether a residual was given (its gradient is the
    output's), so the autograd graph lets the residual go once the call has read it."""
    conv, norm, act = make_block(False, "relu", num_groups=2, bias=True, affine=True, stride=1)
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, act)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    source = torch.randn(1, 6, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    residual = source * 2  # not a leaf: only the caller and a saving graph hold it
    kept = weakref.ref(residual)
    out = block(x, residual=residual)
    del residual
    assert kept() is None
    out.sum().backward()
    torch.testing.assert_close(source.grad, torch.full_like(source, 2.0))


def test_a_residual_is_checked_against_each_calls_output_shape():
    """Whether the op takes the residual follows the output shape of each call (other
    input sizes, conv arguments changed between calls); a residual of another shape is
    PyTorch's add, broadcast or refused as PyTorch refuses it."""
    conv, norm, act = make_block(False, "relu", num_groups=2, bias=True, affine=True, stride=1)
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, act)
    small = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64)
    large = torch.randn(1, 4, 4, 4, 4, dtype=torch.float64)
    for x in (small, large, small):
        residual = torch.randn(block(x).shape, dtype=torch.float64)
        torch.testing.assert_close(block(x, residual=residual), block(x) + residual)
    shift = torch.randn(1, 6, 1, 1, 1, dtype=torch.float64)
    torch.testing.assert_close(block(large, residual=shift), block(large) + shift)
    fitting = torch.randn(block(large).shape, dtype=torch.float64)
    block(large, residual=fitting)
    block.conv.stride = (2, 2, 2)  # the output shrinks: the residual no longer fits
    with pytest.raises(RuntimeError, match="must match the size"):
        block(large, residual=fitting)
    torch.testing.assert_close(block(large, residual=shift), block(large) + shift)


def test_a_compiled_block_takes_its_residual_in_one_graph():
    """torch.compile traces the residual's shape check without a graph break, and the
    traced code keeps no output shape on the module."""
    conv, norm, act = make_block(False, "prelu", num_groups=2, bias=True, affine=True, stride=1)
    block = cutlassfuse.Conv3dNormActivation.from_modules(conv, norm, act).eval()
    compiled = torch.compile(block, fullgraph=True)
    with torch.no_grad():
        for size in (3, 4):
            x = torch.randn(1, 4, size, size, size, dtype=torch.float64)
            residual = torch.randn(block(x).shape, dtype=torch.float64)
            block.__dict__.pop("_kept_output_shape", None)
            out = compiled(x, residual=residual)
            assert "_kept_output_shape" not in block.__dict__
            torch.testing.assert_close(out, block(x) + residual)


def test_residual_opcheck():
    conv, norm, act = make_block(False, "relu", num_groups=2, bias=True, affine=True, stride=1)
    x = torch.randn(1, 4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    residual = torch.randn(1, 6, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    args = (x, conv.weight, conv.bias, [1, 1, 1], [1, 1, 1], [0, 0, 0], 1, [1, 1, 1], False, 2, norm.weight,
            norm.bias, 1e-5, "relu", 0.0, None, False, None, residual)
    torch.library.opcheck(torch.ops.cutlassfuse.conv3d_norm_activation.default, args)


@pytest.mark.parametrize(("residual", "error", "message"), [
    (lambda out: out[:, :3], ValueError,
     r"residual must have the output's shape \[1, 6, 5, 5, 5\], got \[1, 3, 5, 5, 5\]"),
    (lambda out: out.double(), TypeError, "residual must have the input's dtype"),
    (lambda out: out.to("meta"), RuntimeError, "expected all tensors to be on the same device"),
])
def test_residual_must_match_the_output(residual, error, message):
    """The same exception and message from the op (C++) and its fake kernel (meta)."""
    x = torch.randn(1, 4, 5, 5, 5)
    w = torch.randn(6, 4, 3, 3, 3)
    out = torch.randn(1, 6, 5, 5, 5)
    for device in ("cpu", "meta"):
        xd, wd = x.to(device), w.to(device)
        bad = residual(out.to(device))
        if device == "meta" and bad.device.type == "meta":
            continue  # on meta, a meta residual is on the input's device
        with pytest.raises(error, match=message):
            torch.ops.cutlassfuse.conv3d_norm_activation(xd, wd, None, [1] * 3, [1] * 3, [0] * 3, 1, [1] * 3, False, 2,
                                                         None, None, 1e-5, "relu", 0.0, None, False, None, bad)


def test_activation_of_module_rejects_others():
    with pytest.raises(ValueError, match="not one the fused blocks compute"):
        activation_of_module(nn.ReLU6())


def test_functional_defaults_are_torch_nn_defaults():
    x = torch.randn(1, 4, 5, 5, 5, dtype=torch.float64)
    w = torch.randn(6, 4, 3, 3, 3, dtype=torch.float64)
    for name, module in [("leaky_relu", nn.LeakyReLU()), ("elu", nn.ELU())]:
        expected = module(F.group_norm(F.conv3d(x, w), 2))
        torch.testing.assert_close(cutlassfuse.conv3d_norm_activation(x, w, num_groups=2, activation=name), expected)


BACKWARD = torch.ops.cutlassfuse.norm_activation_backward.default
# Every activation, and PReLU with one slope for all channels.


def backward_arguments(activation: str, before: bool, *, bias: bool, affine: bool, memory_format, seed: int = 0):
    """norm_activation_backward's arguments for a float64 norm of 6 channels in 3 groups,
    and its results by autograd."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, low=-1.0, high=1.0):
        return torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low

    y = (rand(2, 6, 3, 4, 5) * 2).contiguous(memory_format=memory_format)
    grad = rand(2, 6, 3, 4, 5).contiguous(memory_format=memory_format)
    b = rand(6) if bias else None
    gamma, beta = (rand(6, low=0.5, high=1.5), rand(6, low=-0.5, high=0.5)) if affine else (None, None)
    act = ACTIVATION_MODULES[activation](6).double()
    (mean, rstd), expected = norm_activation_backward_by_autograd(grad, y, b, gamma, beta, 3, 1e-5, act, before)
    name, parameter, weight = activation_of_module(act)
    weight = None if weight is None else weight.detach()
    return (grad, y, b, mean, rstd, gamma, beta, 3, name, parameter, weight, before), expected


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last_3d],
                         ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize(("activation", "before"), list(itertools.product(ACTIVATION_MODULES, [False, True])))
def test_norm_activation_backward_matches_autograd(activation, before, memory_format):
    for bias, affine in [(True, True), (False, False)]:
        args, expected = backward_arguments(activation, before, bias=bias, affine=affine, memory_format=memory_format)
        got = BACKWARD(*args)
        assert got[0].is_contiguous(memory_format=memory_format)
        assert [g.dtype for g in got] == [torch.float64] * 5
        for name, g, e in zip(("conv_output", "gamma", "beta", "bias", "slopes"), got, expected, strict=True):
            torch.testing.assert_close(g, e, msg=name)


@pytest.mark.parametrize(("activation", "before", "memory_format"), [
    ("prelu", False, torch.channels_last_3d), ("silu", True, torch.contiguous_format),
    ("prelu_shared", True, torch.contiguous_format)])
def test_norm_activation_backward_opcheck(activation, before, memory_format):
    args, _ = backward_arguments(activation, before, bias=True, affine=activation != "silu",
                                 memory_format=memory_format)
    torch.library.opcheck(BACKWARD, tuple(a.float() if isinstance(a, torch.Tensor) else a for a in args))


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"grad_output": torch.ones(2, 6, 3, 4, 4)}, ValueError, "grad_output must have conv_output's shape"),
    ({"grad_output": torch.ones(2, 6, 3, 4, 5, dtype=torch.float32)}, TypeError, "grad_output must have conv_output's"),
    ({"mean": torch.ones(2, 2)}, ValueError, r"mean must have shape \(2, 3\)"),
    ({"rstd": torch.ones(2, 3, dtype=torch.int32)}, TypeError, "rstd must be a floating-point tensor"),
    ({"bias": torch.ones(6, dtype=torch.float32)}, TypeError, "bias must have the input's dtype"),
    ({"num_groups": 4}, ValueError, "num_groups"),
    ({"activation": "prelu"}, ValueError, "needs activation_weight"),
])
def test_norm_activation_backward_rejects_bad_arguments(change, error, message):
    args, _ = backward_arguments("relu", False, bias=True, affine=True, memory_format=torch.contiguous_format)
    names = ("grad_output", "conv_output", "bias", "mean", "rstd", "norm_weight", "norm_bias", "num_groups",
             "activation", "activation_parameter", "activation_weight", "activation_before_norm")
    arguments = {**dict(zip(names, args, strict=True)), **change}
    for device in ("cpu", "meta"):
        with pytest.raises(error, match=message):
            BACKWARD(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in arguments.values()))
