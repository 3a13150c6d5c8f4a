"""On the GPU: the direct convolution of few channels (torch.ops.cutlassfuse.direct_conv3d)
against float64, as close as F.conv3d's own call in the same dtype, every output element
written, PyTorch's output layout, bitwise repeatable; calls outside its scope take ATen's
convolution; FewChannelConv3d runs it for inference and the padded convolution where
autograd records the call."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cutlassfuse import few_channel_conv
from cutlassfuse.few_channel_conv import FewChannelConv3d
from cutlassfuse.testing import poison_cuda_allocator

pytestmark = pytest.mark.gpu

DIRECT = torch.ops.cutlassfuse.direct_conv3d.default
CL = torch.channels_last_3d

# (in, out channels, kernel, stride, padding, dilation, input size)
CASES = {
    "unet_last_2_2_k3": (2, 2, 3, 1, 1, 1, (10, 12, 14)),
    "1_to_4_k3_s2": (1, 4, 3, 2, 1, 1, (9, 11, 13)),
    "8_to_2_k1": (8, 2, 1, 1, 0, 1, (6, 7, 8)),
    "3_to_7_anisotropic": (3, 7, (3, 1, 5), (1, 2, 3), (2, 0, 1), (1, 1, 2), (7, 9, 16)),
    "5_to_8_dilated_no_padding": (5, 8, 3, 1, 0, 2, (8, 8, 8)),
    "4_to_1_k2_s2": (4, 1, 2, 2, 0, 1, (8, 10, 11)),
    # three taps along W at stride 1 (the unrolled row path), strided elsewhere, a partial last group
    "6_to_3_w3_strided_dh": (6, 3, (2, 2, 3), (2, 1, 1), (0, 1, 1), 1, (5, 6, 33)),
}


def case_tensors(name, dtype, *, channels_last, bias=True, seed=0):
    cin, cout, k, s, p, d, size = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(2, cin, *size, device="cuda", dtype=dtype, generator=g)
    kernel = (k,) * 3 if isinstance(k, int) else k
    w = torch.randn(cout, cin, *kernel, device="cuda", dtype=dtype, generator=g) * 0.2
    b = torch.randn(cout, device="cuda", dtype=dtype, generator=g) if bias else None
    if channels_last:
        x = x.contiguous(memory_format=CL)
    return x, w, b, triple(s), triple(p), triple(d)


def triple(v):
    return (v,) * 3 if isinstance(v, int) else v


def max_error(t, reference):
    return (t.double() - reference).abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("name", list(CASES))
def test_direct_conv_against_float64(name, bias, channels_last, dtype):
    x, w, b, s, p, d = case_tensors(name, dtype, channels_last=channels_last, bias=bias)
    expected = F.conv3d(x, w, b, s, p, d)  # PyTorch's own call in this dtype
    poison_cuda_allocator(4 * expected.numel() * expected.element_size())
    out = DIRECT(x, w, b, s, p, d)
    torch.cuda.synchronize()
    assert out.shape == expected.shape and out.dtype == dtype and out.stride() == expected.stride()
    assert torch.isfinite(out).all(), "an output element was not written"
    reference = F.conv3d(x.double(), w.double(), None if b is None else b.double(), s, p, d)
    error, eager_error = max_error(out, reference), max_error(expected, reference)
    # Sums in float either way; the bound is float32's rounding of the sum for float32.
    assert error <= max(1.25 * eager_error, 1e-5 * reference.abs().max().item()), (error, eager_error)
    assert torch.equal(DIRECT(x, w, b, s, p, d), out), "not bitwise repeatable"


@pytest.mark.parametrize("name", ["1_to_4_k3_s2", "3_to_7_anisotropic"])
def test_channels_last_weight_gives_atens_output_layout(name):
    x, w, b, s, p, d = case_tensors(name, torch.float16, channels_last=False)
    w = w.contiguous(memory_format=CL)
    out, expected = DIRECT(x, w, b, s, p, d), F.conv3d(x, w, b, s, p, d)
    assert out.stride() == expected.stride()
    reference = F.conv3d(x.double(), w.double(), b.double(), s, p, d)
    assert max_error(out, reference) <= 1.25 * max_error(expected, reference)


@pytest.mark.parametrize("why", ["9_input_channels", "9_output_channels", "filter_past_shared_memory", "int64_input",
                                 "mixed_dtypes"])
def test_calls_outside_the_kernel_take_atens_convolution(why):
    x = torch.randn(1, 2, 6, 6, 6, device="cuda", dtype=torch.float16)
    w = torch.randn(2, 2, 3, 3, 3, device="cuda", dtype=torch.float16)
    if why == "9_input_channels":
        x, w = torch.randn(1, 9, 6, 6, 6, device="cuda", dtype=torch.float16), torch.randn(2, 9, 3, 3, 3, device="cuda",
                                                                                             dtype=torch.float16)
    elif why == "9_output_channels":
        w = torch.randn(9, 2, 3, 3, 3, device="cuda", dtype=torch.float16)
    elif why == "filter_past_shared_memory":  # 8 x 8 x 7^3 floats: 88 KB
        x, w = torch.randn(1, 8, 8, 8, 8, device="cuda", dtype=torch.float16), torch.randn(8, 8, 7, 7, 7, device="cuda",
                                                                                             dtype=torch.float16)
    elif why == "int64_input":
        x, w = x.long(), w.long()
        with pytest.raises(RuntimeError):
            F.conv3d(x, w)  # PyTorch's error, raised by the op too
        with pytest.raises(RuntimeError):
            DIRECT(x, w, None, (1, 1, 1), (0, 0, 0), (1, 1, 1))
        return
    else:
        w = w.float()
        with pytest.raises(RuntimeError) as aten:
            F.conv3d(x, w)
        with pytest.raises(RuntimeError) as op:
            DIRECT(x, w, None, (1, 1, 1), (0, 0, 0), (1, 1, 1))
        assert str(op.value) == str(aten.value)
        return
    assert torch.equal(DIRECT(x, w, None, (1, 1, 1), (1, 1, 1), (1, 1, 1)), F.conv3d(x, w, None, 1, 1))


def test_filter_larger_than_the_input_raises_pytorchs_error():
    x = torch.randn(1, 2, 2, 2, 2, device="cuda", dtype=torch.float16)
    w = torch.randn(2, 2, 3, 3, 3, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="[Kk]ernel size"):
        DIRECT(x, w, None, (1, 1, 1), (0, 0, 0), (1, 1, 1))
    assert torch.isfinite(DIRECT(x, w, None, (1, 1, 1), (1, 1, 1), (1, 1, 1))).all()  # the context stays usable


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """Which way FewChannelConv3d's calls went: "direct", or "padded to N" per padded tensor."""
    seen = []
    direct, pad = few_channel_conv._DIRECT_CONV, few_channel_conv._with_zero_channels
    monkeypatch.setattr(few_channel_conv, "_DIRECT_CONV", lambda *a: seen.append("direct") or direct(*a))
    monkeypatch.setattr(few_channel_conv, "_with_zero_channels",
                        lambda t, channels: seen.append(f"padded to {pad(t, channels).shape[1]}") or pad(t, channels))
    return seen


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("in_channels", "stride"), [(1, 2), (3, 1)])
def test_module_inference_runs_the_direct_convolution(dtype, channels_last, in_channels, stride, calls):
    torch.manual_seed(0)
    conv = nn.Conv3d(in_channels, 2, 3, stride=stride, padding=1).cuda().to(dtype)
    layer = FewChannelConv3d.from_conv(conv)
    x = torch.randn(2, in_channels, 20, 24, 28, device="cuda", dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=CL)
    with torch.no_grad():
        got, eager = layer(x), conv(x)
        reference = F.conv3d(x.double(), conv.weight.double(), conv.bias.double(), stride, 1)
    assert calls == ["direct"]
    assert got.shape == eager.shape and got.dtype == dtype and got.stride() == eager.stride()
    assert max_error(got, reference) <= 1.25 * max_error(eager, reference) + 1e-6


def test_module_call_that_autograd_records_pads_to_8_channels_and_trains(calls):
    torch.manual_seed(0)
    conv = nn.Conv3d(2, 2, 3, padding=1).cuda().half()
    layer = FewChannelConv3d.from_conv(conv)
    x = torch.randn(2, 2, 8, 8, 8, device="cuda", dtype=torch.half, requires_grad=True)
    out = layer(x)
    assert calls == ["padded to 8", "padded to 8"]
    out.float().square().sum().backward()
    assert x.grad is not None and conv.weight.grad is not None and conv.bias.grad is not None
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), out.detach(), rtol=2e-3, atol=2e-3)
    assert calls == ["direct"]
