"""torch.ops.cutlassfuse.channel_rms_norm on the CPU (ATen's ops: the op's reference)
against float64 formulas (diffusers' WanRMS_norm, torch's RMS norm over moved channels),
its fake kernel, errors and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

RMS_NORM = torch.ops.cutlassfuse.channel_rms_norm.default
ACTIVATIONS = {"identity": (0.0, lambda x: x), "silu": (0.0, F.silu),
               "leaky_relu": (0.2, lambda x: F.leaky_relu(x, 0.2)), "gelu": (0.0, F.gelu),
               "elu": (0.5, lambda x: F.elu(x, 0.5))}
# shape, memory format
LAYOUTS = {"ncdhw": ((2, 16, 3, 4, 5), torch.contiguous_format),
           "channels_last_3d": ((2, 16, 3, 4, 5), torch.channels_last_3d),
           "nchw": ((3, 24, 4, 6), torch.contiguous_format), "channels_last": ((3, 24, 4, 6), torch.channels_last)}


def case(layout, dtype=torch.float64, affine=True):
    shape, memory_format = LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=dtype).contiguous(memory_format=memory_format)
    weight, bias = (torch.randn(shape[1], generator=g, dtype=dtype) if affine else None for _ in range(2))
    return x, weight, bias


def channels(v, like):
    return v.view(1, -1, *[1] * (like.dim() - 2))


def wan_formula(x, weight, bias):
    """diffusers' WanRMS_norm: F.normalize over the channels, times sqrt(C), gamma and bias."""
    return F.normalize(x, dim=1) * math.sqrt(x.shape[1]) * channels(weight, x) + channels(bias, x)


def rms_formula(x, weight, bias, eps):
    """torch's RMS norm over the channels moved last (LTX-Video's RMSNorm)."""
    y = F.rms_norm(x.movedim(1, -1), (x.shape[1],), weight, eps).movedim(-1, 1)
    return y if bias is None else y + channels(bias, x)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_clamp_is_wans_normalize(layout, activation):
    x, weight, bias = case(layout)
    parameter, act = ACTIVATIONS[activation]
    out = RMS_NORM(x, weight, bias, 1e-12 / math.sqrt(x.shape[1]), True, activation, parameter)
    torch.testing.assert_close(out, act(wan_formula(x, weight, bias)), rtol=1e-12, atol=1e-12)
    assert out.stride() == x.stride()


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "no_affine"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_without_clamp_is_torchs_rms_norm(layout, affine):
    x, weight, bias = case(layout, affine=affine)
    out = RMS_NORM(x, weight, bias, 1e-3, False, "identity", 0.0)
    torch.testing.assert_close(out, rms_formula(x, weight, bias, 1e-3), rtol=1e-12, atol=1e-12)
    assert out.stride() == x.stride()


def test_clamp_bounds_the_rms_of_a_zero_pixel():
    x = torch.zeros(1, 8, 2, 2, 2, dtype=torch.float64)
    x[..., 0, 0, 0] = 1e-9
    out = RMS_NORM(x, None, None, 1e-6, True, "identity", 0.0)
    torch.testing.assert_close(out, x / 1e-6)  # every rms below eps: divided by eps


def test_16_bit_input_rounds_once_with_float32_affine():
    x, weight, bias = case("channels_last_3d", torch.float32)
    out = RMS_NORM(x.bfloat16(), weight, bias, 1e-6, False, "silu", 0.0)
    assert out.dtype == torch.bfloat16
    expected = F.silu(rms_formula(x.bfloat16().double(), weight.double(), bias.double(), 1e-6))
    torch.testing.assert_close(out, expected.bfloat16(), rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["ncdhw", "channels_last_3d"])
def test_opcheck(layout):
    x, weight, bias = case(layout, torch.float32)
    torch.library.opcheck(RMS_NORM, (x, weight, bias, 1e-6, True, "silu", 0.0))
    torch.library.opcheck(RMS_NORM, (x, None, None, 1e-6, False, "identity", 0.0))


def test_gradients_are_the_formulas():
    x, weight, bias = (t.requires_grad_() for t in case("channels_last_3d"))
    x = x[:1, :, :2]
    out = RMS_NORM(x, weight, bias, 1e-3, True, "silu", 0.0)
    assert out.grad_fn.name() == "CutlassfuseChannelRmsNormBackward"  # the op's kernel ran, its node recorded
    for clamp in (True, False):
        call = lambda *a: RMS_NORM(*a, 1e-3, clamp, "silu", 0.0)  # noqa: E731
        assert torch.autograd.gradcheck(call, (x, weight, bias))
        assert torch.autograd.gradgradcheck(call, (x, weight, bias))
    assert torch.autograd.gradcheck(lambda a, w: RMS_NORM(a, w, None, 1e-3, True), (x, weight.detach()))


@pytest.mark.parametrize(("change", "message", "error"), [
    (lambda x, w, b: (x[0, 0, 0, 0], w, b), "must have a batch and a channel dimension", RuntimeError),
    (lambda x, w, b: (x.int(), None, None), "must be a floating-point tensor", TypeError),
    (lambda x, w, b: (x, w[:4], b), r"weight must have shape \(16,\)", ValueError),
    (lambda x, w, b: (x, w, b.view(4, 4)), r"bias must have shape \(16,\)", ValueError),
    (lambda x, w, b: (x, w.int(), b), "weight must be a floating-point tensor", TypeError),
], ids=["rank", "integer", "weight_shape", "bias_shape", "weight_type"])
def test_invalid_calls_raise(change, message, error):
    x, weight, bias = case("ncdhw")
    with pytest.raises(error, match=message):
        RMS_NORM(*change(x, weight, bias), 1e-6, False, "identity", 0.0)


@pytest.mark.parametrize("eps", [-1.0, float("nan")])
def test_invalid_eps_raises(eps):
    x, weight, bias = case("ncdhw")
    with pytest.raises(ValueError, match="eps must be non-negative"):
        RMS_NORM(x, weight, bias, eps, False, "identity", 0.0)


@pytest.mark.parametrize("activation", ["prelu", "tanh"])
def test_activations_it_does_not_compute_raise(activation):
    x, weight, bias = case("ncdhw")
    with pytest.raises(RuntimeError, match="activation must be one of"):
        RMS_NORM(x, weight, bias, 1e-6, False, activation, 0.0)
