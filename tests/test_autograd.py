"""Backward: gradcheck in float64, agreement with eager autograd, and every opcheck."""

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse

OP = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default

# (in, out, size, kernel, stride, padding, output_padding, dilation, conv groups, num_groups, bias, affine)
CONFIGS = [
    (4, 6, (3, 3, 3), 2, 1, 0, 0, 1, 1, 3, True, True),
    (4, 6, (3, 2, 3), 2, (2, 1, 1), (0, 1, 0), (1, 0, 0), 1, 1, 2, True, True),
    (4, 4, (2, 3, 2), 3, 1, 1, 0, (1, 2, 1), 2, 4, False, True),
    (2, 6, (3, 3, 2), 1, 1, 0, 0, 1, 1, 1, True, False),
]


def make(config, dtype, requires_grad=True, seed=0):
    cin, cout, size, k, stride, padding, output_padding, dilation, groups, num_groups, bias, affine = config
    g = torch.Generator().manual_seed(seed)

    def t(*shape, scale=1.0, offset=0.0):
        return (torch.randn(*shape, generator=g) * scale + offset).to(dtype).requires_grad_(requires_grad)

    return dict(input=t(2, cin, *size), weight=t(cin, cout // groups, k, k, k, scale=0.3),
                bias=t(cout, scale=0.1) if bias else None, stride=stride, padding=padding,
                output_padding=output_padding, groups=groups, dilation=dilation, num_groups=num_groups,
                norm_weight=t(cout, scale=0.2, offset=1.0) if affine else None,
                norm_bias=t(cout, scale=0.1) if affine else None)


def eager(a):
    y = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"])
    return F.group_norm(F.relu(y), a["num_groups"], a["norm_weight"], a["norm_bias"])


def tensors(a):
    return [a[k] for k in ("input", "weight", "bias", "norm_weight", "norm_bias") if a[k] is not None]


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_gradcheck_float64(config):
    a = make(config, torch.float64)
    names = [k for k in ("input", "weight", "bias", "norm_weight", "norm_bias") if a[k] is not None]

    def f(*ts):
        return cutlassfuse.conv_transpose3d_relu_group_norm(**{**a, **dict(zip(names, ts, strict=True))})

    assert torch.autograd.gradcheck(f, tuple(a[n] for n in names))


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
    cutlassfuse.conv_transpose3d_relu_group_norm(**a).sum().backward()
    assert a["weight"].grad is not None and a["input"].grad is None


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_opcheck_all(config):
    a = make(config, torch.float32)
    args = (a["input"], a["weight"], a["bias"], a["norm_weight"], a["norm_bias"], a["num_groups"], 1e-5,
            *[list(v) if isinstance(v, tuple) else [v] * 3 for v in (a["stride"], a["padding"], a["output_padding"])],
            a["groups"], list(a["dilation"]) if isinstance(a["dilation"], tuple) else [a["dilation"]] * 3, None)
    torch.library.opcheck(OP, args)


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
