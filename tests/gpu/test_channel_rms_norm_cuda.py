"""On the GPU: torch.ops.cutlassfuse.channel_rms_norm's kernel against float64 (no further
from it than diffusers' Wan norm written in PyTorch's ops in the same type), every output
element written, deterministic, for dense input of any layout; other calls take ATen's
ops; calls that autograd records the kernel with the formula's derivatives; Wan's fused
decoder normalizes with it."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.testing import poison_cuda_allocator
from test_channel_rms_norm import RMS_NORM, channels, wan_formula  # tests/
from test_library_modules import small_wan_vae, wan  # tests/
from test_replication_pad_cuda import kernel_names  # tests/gpu

pytestmark = pytest.mark.gpu

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
KERNEL = "channel_rms_norm_"
EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}
# shape, memory format (None: (N, T, C, H, W) memory, a plane per frame): Wan's channel
# counts, the most channels-last takes; pixels in pairs a lane (from 2^16) and one, and
# not a multiple of the 32-lane tile
LAYOUTS = {"ncdhw_96": ((2, 96, 3, 5, 7), torch.contiguous_format),
           "ncdhw_64": ((2, 64, 3, 8, 12), torch.contiguous_format),
           "frames_96": ((2, 96, 3, 8, 10), None), "ncdhw_pairs": ((1, 16, 4, 128, 128), torch.contiguous_format),
           "channels_last_3d_1024": ((1, 1024, 2, 3, 5), torch.channels_last_3d),
           "channels_last_3d_96": ((2, 96, 3, 5, 7), torch.channels_last_3d),
           "channels_last_3d_384": ((1, 384, 2, 9, 8), torch.channels_last_3d),
           "channels_last_3d_8": ((3, 8, 4, 4, 5), torch.channels_last_3d),
           "nchw_40": ((3, 40, 7, 9), torch.contiguous_format),
           "channels_last_384": ((2, 384, 5, 6), torch.channels_last)}
ACTIVATIONS = {"identity": lambda x: x, "silu": F.silu, "gelu": F.gelu}


def case(layout, dtype=torch.float64):
    shape, memory_format = LAYOUTS[layout]
    g = torch.Generator(device="cuda").manual_seed(0)
    if memory_format is None:
        n, c, t, h, w = shape
        x = torch.randn(n, t, c, h, w, device="cuda", generator=g, dtype=torch.float64).transpose(1, 2)
    else:
        x = torch.randn(shape, device="cuda", generator=g, dtype=torch.float64).contiguous(memory_format=memory_format)
    weight, bias = (torch.randn(shape[1], device="cuda", generator=g, dtype=torch.float64) for _ in range(2))
    return x.to(dtype), weight.to(dtype), bias.to(dtype)


def library_formula(x, weight, bias, activation):
    """diffusers' WanRMS_norm as it computes in 16-bit types: F.normalize in float32, the
    normalized values rounded, then the scale, gamma, bias and activation each rounded."""
    normalized = F.normalize(x.float(), dim=1).to(x.dtype)
    return ACTIVATIONS[activation](normalized * math.sqrt(x.shape[1]) * channels(weight, x) + channels(bias, x))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_kernel_matches_float64(layout, activation, dtype):
    x64, weight64, bias64 = case(layout)
    expected = ACTIVATIONS[activation](wan_formula(x64, weight64, bias64))
    x, weight, bias = x64.to(dtype), weight64.to(dtype), bias64.to(dtype)
    eps = 1e-12 / math.sqrt(x.shape[1])
    poison_cuda_allocator(4 * x.numel() * x.element_size())
    with torch.no_grad():
        names = kernel_names(lambda: RMS_NORM(x, weight, bias, eps, True, activation, 0.0))
        out = RMS_NORM(x, weight, bias, eps, True, activation, 0.0)
        again = RMS_NORM(x, weight, bias, eps, True, activation, 0.0)
        eager = library_formula(x, weight, bias, activation)
    assert any(KERNEL in n for n in names), names
    assert out.stride() == x.stride() and not out.isnan().any()
    assert torch.equal(out, again)
    ours = (out.double() - expected).abs().max().item()
    theirs = (eager.double() - expected).abs().max().item()
    # One rounding where the library's ops round four times; slack for the float32 math: an
    # ulp of 16-bit output, a few of float32 (the kernel's sequential sum and fast-math exp
    # against ATen's reduction tree and exp).
    slack = (4 if dtype == torch.float32 else 1) * EPS[dtype]
    assert ours <= theirs + slack * expected.abs().max().item(), (ours, theirs)


def test_without_clamp_or_affine_matches_float64():
    x64, _, _ = case("channels_last_3d_96")
    x = x64.half()
    with torch.no_grad():
        names = kernel_names(lambda: RMS_NORM(x, None, None, 1e-6, False, "identity", 0.0))
        out = RMS_NORM(x, None, None, 1e-6, False, "identity", 0.0)
    assert any(KERNEL in n for n in names), names
    expected = x64 * torch.rsqrt(x64.square().mean(1, keepdim=True) + 1e-6)
    assert (out.double() - expected).abs().max().item() <= EPS[torch.float16] * expected.abs().max().item()


@pytest.mark.parametrize("layout", ["channels_last_3d_96", "ncdhw_64"])
def test_float32_affine_on_16_bit_input_runs_the_kernel(layout):
    x64, weight64, bias64 = case(layout)
    x, weight, bias = x64.half(), weight64.float(), bias64.float()
    with torch.no_grad():
        names = kernel_names(lambda: RMS_NORM(x, weight, bias, 1e-6, False, "silu", 0.0))
        out = RMS_NORM(x, weight, bias, 1e-6, False, "silu", 0.0)
    assert any(KERNEL in n for n in names), names
    x = x.double()
    expected = F.silu(x * torch.rsqrt(x.square().mean(1, keepdim=True) + 1e-6) * channels(weight64, x)
                      + channels(bias64, x))
    assert (out.double() - expected).abs().max().item() <= 2 * EPS[torch.float16] * expected.abs().max().item()


@pytest.mark.parametrize("layout", ["channels_last_12", "channels_last_1032", "strided", "bfloat16_affine"])
def test_other_calls_take_atens_ops(layout):
    if layout.startswith("channels_last"):  # channels not a multiple of 8, or above 1024
        count = int(layout.split("_")[-1])
        x = torch.randn(2, count, 3, 4, 5, device="cuda").contiguous(memory_format=torch.channels_last_3d)
    elif layout == "strided":  # not dense
        x = torch.randn(2, 16, 3, 4, 10, device="cuda")[..., ::2]
    else:  # weight and bias neither float32 nor the input's type
        x = torch.randn(2, 16, 3, 4, 5, device="cuda", dtype=torch.float16)
    affine = torch.bfloat16 if layout == "bfloat16_affine" else x.dtype
    weight, bias = (torch.randn(x.shape[1], device="cuda", dtype=affine) for _ in range(2))
    with torch.no_grad():
        names = kernel_names(lambda: RMS_NORM(x, weight, bias, 1e-6, True, "silu", 0.0))
        out = RMS_NORM(x, weight, bias, 1e-6, True, "silu", 0.0)
    assert not any(KERNEL in n for n in names), names
    x, weight, bias = x.double(), weight.double(), bias.double()
    expected = F.silu(F.normalize(x, dim=1, eps=1e-6 * math.sqrt(x.shape[1])) * math.sqrt(x.shape[1])
                      * channels(weight, x) + channels(bias, x))
    torch.testing.assert_close(out.double(), expected, rtol=2e-3, atol=2e-3)


def test_recorded_calls_run_the_kernel_with_the_formulas_gradients():
    x64, weight64, bias64 = case("channels_last_3d_96")
    ours = [t.float().requires_grad_() for t in (x64, weight64, bias64)]
    theirs = [t.float().detach().requires_grad_() for t in (x64, weight64, bias64)]
    eps = 1e-12 / math.sqrt(x64.shape[1])
    names = kernel_names(lambda: RMS_NORM(*ours, eps, True, "silu", 0.0))
    assert any(KERNEL in n for n in names), names
    out = RMS_NORM(*ours, eps, True, "silu", 0.0)
    assert out.grad_fn.name() == "CutlassfuseChannelRmsNormBackward"
    grad = torch.randn_like(out)
    out.backward(grad)
    F.silu(wan_formula(*theirs)).backward(grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("channels_last", [False, True], ids=["input_layout", "channels_last"])
def test_fused_wan_decoder_normalizes_with_the_kernel(channels_last):
    vae = small_wan_vae().cuda()
    reference = copy.deepcopy(vae)  # float64
    vae = vae.half()
    fused = copy.deepcopy(vae)
    fused.decoder = cutlassfuse.fuse(fused.decoder, channels_last=channels_last).model
    z = torch.randn(1, 16, 3, 8, 8, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        names = kernel_names(lambda: fused.decode(z))
        expected = reference.decode(z.double()).sample
        errors = [(m.decode(z).sample.double() - expected).abs().max().item() for m in (vae, fused)]
    norms = sum(isinstance(m, wan.WanRMS_norm) for m in vae.decoder.modules())
    assert sum(KERNEL in n for n in names) == 3 * norms, names  # every norm, one kernel each chunk
    assert not any("NormTwoOps" in n for n in names), names  # no F.normalize left
    assert errors[1] <= 1.5 * errors[0] + 1e-4, errors
