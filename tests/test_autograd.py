"""Backward (registered at the Autograd key in C++, cpp/src/torch/autograd.cpp):
gradcheck in float64, agreement with eager autograd, and every opcheck."""

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.testing import make_inputs, op_arguments

OP = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default
TENSORS = ("input", "weight", "bias", "norm_weight", "norm_bias")

# Layers of two samples (make_inputs keywords): strides, padding, dilation, conv groups, bias and affine off,
# kernel == stride.
CONFIGS = [
    dict(in_channels=4, out_channels=6, size=(2, 3, 2), kernel=(2, 1, 3), stride=(2, 1, 3), num_groups=3),
    dict(in_channels=4, out_channels=6, size=(3, 3, 3), kernel=2, num_groups=3),
    dict(in_channels=4, out_channels=6, size=(3, 2, 3), kernel=2, stride=(2, 1, 1), padding=(0, 1, 0),
         output_padding=(1, 0, 0), num_groups=2),
    dict(in_channels=4, out_channels=4, size=(2, 3, 2), kernel=3, padding=1, dilation=(1, 2, 1), groups=2,
         num_groups=4, bias=False),
    dict(in_channels=2, out_channels=6, size=(3, 3, 2), kernel=1, num_groups=1, affine=False),
]


def make(config, dtype, requires_grad=True):
    return make_inputs(batch=2, **config, dtype=dtype, requires_grad=requires_grad)


def eager(a):
    y = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"])
    return F.group_norm(F.relu(y), a["num_groups"], a["norm_weight"], a["norm_bias"], a["eps"])


def tensors(a):
    return [a[k] for k in TENSORS if a[k] is not None]


def op_of_tensors(a):
    """The op as a function of the call's tensors (for gradcheck), and those tensors."""
    names = [k for k in TENSORS if a[k] is not None]

    def f(*ts):
        return cutlassfuse.conv_transpose3d_relu_group_norm(**{**a, **dict(zip(names, ts, strict=True))})

    return f, tuple(a[n] for n in names)


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_gradcheck_float64(config):
    assert torch.autograd.gradcheck(*op_of_tensors(make(config, torch.float64)))


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_gradgradcheck_float64(config):
    """Double backward (create_graph) through the op's backward."""
    assert torch.autograd.gradgradcheck(*op_of_tensors(make(config, torch.float64)))


def test_second_order_gradients_match_eager():
    """A gradient penalty (the gradient's norm, differentiated again), as WGAN-GP trains."""
    ours, theirs = make(CONFIGS[1], torch.float64), make(CONFIGS[1], torch.float64)
    grads = {}
    for name, a, fn in (("ours", ours, lambda a: cutlassfuse.conv_transpose3d_relu_group_norm(**a)),
                        ("eager", theirs, eager)):
        (dx,) = torch.autograd.grad(fn(a).pow(2).sum(), a["input"], create_graph=True)
        dx.pow(2).sum().backward()
        grads[name] = [t.grad for t in tensors(a)]
    for mine, reference in zip(grads["ours"], grads["eager"], strict=True):
        torch.testing.assert_close(mine, reference, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_gradients_match_eager_float32(config):
    ours, theirs = make(config, torch.float32), make(config, torch.float32)
    grad = torch.randn_like(eager(theirs))
    cutlassfuse.conv_transpose3d_relu_group_norm(**ours).backward(grad)
    eager(theirs).backward(grad)
    for mine, reference in zip(tensors(ours), tensors(theirs), strict=True):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-4, atol=1e-5)


def test_only_requested_gradients_are_computed():
    a = make(CONFIGS[0], torch.float32, requires_grad=False)
    a["weight"].requires_grad_()
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    assert out.grad_fn is not None
    out.sum().backward()
    assert a["weight"].grad is not None and a["input"].grad is None


def test_no_graph_without_a_wanted_gradient():
    a = make(CONFIGS[0], torch.float32, requires_grad=False)
    assert cutlassfuse.conv_transpose3d_relu_group_norm(**a).grad_fn is None
    a = make(CONFIGS[0], torch.float32)
    with torch.no_grad():
        assert cutlassfuse.conv_transpose3d_relu_group_norm(**a).grad_fn is None


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_opcheck_all(config):
    torch.library.opcheck(OP, op_arguments(make(config, torch.float32)))


def test_module_trains():
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(4, 8, 3, 2, bias=True)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    x, target = torch.rand(2, 4, 3, 3, 3), torch.randn(2, 8, 5, 5, 5)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = F.mse_loss(module(x), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def saved_sizes(module, x) -> tuple[list[int], torch.Tensor]:
    """The element counts of the tensors autograd saves for the backward of module(x), and
    its output."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    return sizes, out


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_recompute_keeps_only_the_input_and_gives_the_same_gradients(dtype):
    torch.manual_seed(0)
    kept = cutlassfuse.ConvTranspose3dReLUGroupNorm(4, 8, 3, 2, bias=True, stride=2, padding=1).to(dtype)
    recomputed = cutlassfuse.ConvTranspose3dReLUGroupNorm.from_modules(kept.conv_transpose, kept.group_norm,
                                                                       recompute=True)
    x = torch.randn(2, 4, 3, 4, 3, dtype=dtype, requires_grad=True)
    grads = []
    for module in (kept, recomputed):
        sizes, out = saved_sizes(module, x)
        # The activation (the output's size) is saved only without recompute.
        assert (out.numel() in sizes) == (module is kept), sizes
        grad = torch.autograd.grad(out, [x, *module.parameters()], torch.ones_like(out))
        grads.append(grad)
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(recomputed(x), kept(x), rtol=0, atol=0)
