"""torch.ops.cutlassfuse.bias_add on the CPU (ATen's adds: the op's reference), its fake
kernel, errors and gradients, and fuse() splitting a traced Conv3d's bias into it, with the
residual added to the convolution's output where an add reads that output alone."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.bias_add import conv3d_bias_add

BIAS_ADD = torch.ops.cutlassfuse.bias_add.default
CL = torch.channels_last_3d


def conv_output_bias_residual(dtype=torch.float32, memory_format=torch.contiguous_format, channels=6):
    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(2, channels, 3, 4, 5, generator=g, dtype=dtype).contiguous(memory_format=memory_format)
            for _ in range(2))
    return x, torch.randn(channels, generator=g, dtype=dtype), r


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["bias", "bias_residual"])
def test_op_adds_bias_per_channel_then_residual(with_residual, memory_format):
    x, b, r = conv_output_bias_residual(torch.float64, memory_format)
    out = BIAS_ADD(x, b, r if with_residual else None)
    expected = F.conv3d(x, torch.eye(6, dtype=torch.float64).view(6, 6, 1, 1, 1), b)
    if with_residual:
        expected = expected + r
    assert torch.equal(out, expected)
    assert out.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("with_residual", [False, True], ids=["bias", "bias_residual"])
def test_opcheck(with_residual):
    x, b, r = conv_output_bias_residual()
    torch.library.opcheck(BIAS_ADD, (x, b, r if with_residual else None))


def test_gradients_are_atens():
    x, b, r = (t.requires_grad_() for t in conv_output_bias_residual(torch.float64))
    out = BIAS_ADD(x, b, r)
    assert out.grad_fn.name() == "CutlassfuseBiasAddBackward"  # the op's kernel ran, its node recorded
    assert torch.autograd.gradcheck(lambda *a: BIAS_ADD(*a), (x, b, r))
    assert torch.autograd.gradgradcheck(lambda *a: BIAS_ADD(*a), (x, b, r))
    assert torch.autograd.gradcheck(lambda *a: BIAS_ADD(*a), (x, b))
    tangents = tuple(torch.randn_like(t) for t in (x, b, r))
    _, jvp = torch.func.jvp(lambda *a: BIAS_ADD(*a), (x.detach(), b.detach(), r.detach()), tangents)
    assert torch.allclose(jvp, tangents[0] + tangents[1].view(1, -1, 1, 1, 1) + tangents[2])


def test_gradients_of_broadcast_and_promoted_residuals():
    """A residual that broadcasts, or of a wider type, gets its gradient in its own sizes
    and type, as ATen's adds give them."""
    x, b, r = conv_output_bias_residual(torch.float32)
    cases = {"broadcast": (x, b, r[:, :, :1].double()), "promoted": (x, b, r.double())}
    for name, (x, b, r) in cases.items():
        leaves = [t.detach().requires_grad_() for t in (x, b, r)]
        ours = torch.autograd.grad(BIAS_ADD(*leaves).sum(), leaves)
        theirs = torch.autograd.grad(((leaves[0] + leaves[1].view(1, -1, 1, 1, 1)) + leaves[2]).sum(), leaves)
        for got, expected in zip(ours, theirs, strict=True):
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize(("shapes", "message"), [
    (((2, 6, 3), (5,)), "one value per channel"),
    (((6,), (6,)), "channel dimension"),
    (((2, 6, 3), (6, 1)), "one value per channel"),
])
def test_invalid_calls_raise(shapes, message):
    x, b = (torch.randn(s) for s in shapes)
    with pytest.raises(RuntimeError, match=message):
        BIAS_ADD(x, b)


class ResnetTail(nn.Module):
    """A resnet block's end: conv2(h) + shortcut(x), then an output convolution."""

    def __init__(self, in_place=False):
        super().__init__()
        self.norm = nn.GroupNorm(2, 8)
        self.conv1 = nn.Conv3d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv3d(8, 8, 3, padding=1)
        self.shortcut = nn.Conv3d(8, 8, 1)
        self.out = nn.Conv3d(8, 4, 3, padding=1, padding_mode="replicate")
        self.in_place = in_place

    def forward(self, x):
        h = self.conv2(self.conv1(F.silu(self.norm(x))))
        if self.in_place:
            residual = self.shortcut(x)
            residual.add_(h)  # writes the residual: not the convolution's own output
            h = residual
        else:
            h = h + self.shortcut(x)
        return self.out(h)


def test_fuse_splits_traced_conv_biases_and_joins_the_residual():
    model = ResnetTail().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert result.bias_adds == ["conv1: Conv3d's bias -> cutlassfuse bias_add",
                                "conv2: Conv3d's bias + shortcut -> cutlassfuse bias_add",
                                "shortcut: Conv3d's bias -> cutlassfuse bias_add"], str(result)
    assert "conv2: Conv3d's bias + shortcut" in str(result)
    adds = [n for n in result.model.graph.nodes if n.target is conv3d_bias_add]
    assert len(adds) == 3 and sum(n.args[-1] is not None for n in adds) == 1
    # The replicate-padded convolution keeps its module; the state dict its keys.
    assert any(n.op == "call_module" and n.target == "out" for n in result.model.graph.nodes)
    assert list(result.model.state_dict()) == list(model.state_dict())
    x = torch.randn(1, 8, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x), rtol=0, atol=0)


def test_fuse_keeps_an_in_place_add_into_another_value():
    model = ResnetTail(in_place=True).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert "conv2: Conv3d's bias -> cutlassfuse bias_add" in result.bias_adds, str(result)
    assert not any("+" in line for line in result.bias_adds), str(result)
    x = torch.randn(1, 8, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x), rtol=0, atol=0)


def test_fuse_leaves_convolutions_with_hooks_or_without_bias():
    model = ResnetTail().eval()
    model.conv2.register_forward_hook(lambda *args: None)
    model.shortcut.bias = None
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert result.bias_adds == ["conv1: Conv3d's bias -> cutlassfuse bias_add"], str(result)
