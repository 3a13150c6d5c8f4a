"""On the GPU: torch.ops.cutlassfuse.bias_add's one-pass kernel adds a convolution's bias as
ATen does (bit for bit without a residual, one rounding with one), every output element
written, in the input's layout, 16 bytes a thread where the sizes allow and one element
where they do not; other calls take ATen's adds, calls that autograd records the kernel
with the adds' derivatives; a fused
resnet tail runs it."""

import copy

import pytest
import torch

import cutlassfuse
from cutlassfuse.kernel_mode import KernelMode
from cutlassfuse.testing import poison_cuda_allocator
from test_bias_add import BIAS_ADD, ResnetTail  # tests/
from test_replication_pad_cuda import kernel_names  # tests/gpu

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# (shape, which kernel: 16 bytes a thread, or an element) in NCDHW / channels-last
SHAPES = {"video": (1, 64, 3, 16, 16), "odd_planes": (2, 12, 3, 5, 7), "odd_channels": (2, 3, 2, 8, 8)}
EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def case(shape, dtype, memory_format):
    g = torch.Generator(device="cuda").manual_seed(0)
    x, r = (torch.randn(shape, device="cuda", generator=g).to(dtype).contiguous(memory_format=memory_format)
            for _ in range(2))
    return x, torch.randn(shape[1], device="cuda", generator=g).to(dtype), r


def eager(x, b, r=None):
    out = x + b.view(1, -1, 1, 1, 1)  # as ATen adds a convolution's bias, in place after it
    return out if r is None else out + r


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bias_alone_is_atens_bitwise(shape, memory_format, dtype):
    x, b, _ = case(SHAPES[shape], dtype, memory_format)
    poison_cuda_allocator(4 * x.numel() * x.element_size())
    out = BIAS_ADD(x, b)
    torch.cuda.synchronize()
    assert out.is_contiguous(memory_format=memory_format) and out.dtype == dtype
    assert torch.equal(out, eager(x, b)), "an element differs or was not written"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bias_and_residual_rounded_once(shape, memory_format, dtype):
    x, b, r = case(SHAPES[shape], dtype, memory_format)
    poison_cuda_allocator(4 * x.numel() * x.element_size())
    out = BIAS_ADD(x, b, r)
    torch.cuda.synchronize()
    exact = eager(x.double(), b.double(), r.double())
    # The float32 sum (its own rounding bounded by the terms' magnitudes), rounded once to
    # the type: within one unit in the last place, and no further than eager's two roundings.
    error = (out.double() - exact).abs()
    terms = eager(x.double().abs(), b.double().abs(), r.double().abs())
    assert torch.all(error <= 2 * EPS[dtype] * exact.abs() + 2 * 2.0**-24 * terms), "an element differs or unwritten"
    assert error.max() <= (eager(x, b, r).double() - exact).abs().max()
    if dtype == torch.float32:
        assert torch.equal(out, eager(x, b, r))


@pytest.mark.parametrize(("shape", "memory_format", "width"), [
    ("video", torch.contiguous_format, 8), ("video", CL, 8),
    ("odd_planes", torch.contiguous_format, 1), ("odd_channels", CL, 1)])
def test_kernel_width_follows_the_sizes(shape, memory_format, width):
    x, b, r = case(SHAPES[shape], torch.float16, memory_format)
    names = kernel_names(lambda: BIAS_ADD(x, b, r))
    assert [n for n in names if "bias_add_kernel" in n] == [
        next(n for n in names if f"bias_add_kernel<__half, {width}, " in n)], names
    assert not any("elementwise_kernel" in n for n in names), names


@pytest.mark.parametrize("call", ["other_layouts", "broadcast_residual", "float64", "promoted_residual"])
def test_calls_outside_the_kernel_take_atens_adds(call):
    x, b, r = case(SHAPES["video"], torch.float16, torch.contiguous_format)
    if call == "other_layouts":
        r = r.contiguous(memory_format=CL)
    elif call == "broadcast_residual":
        r = r[:, :, :1]
    elif call == "float64":
        x, b, r = x.double(), b.double(), r.double()
    else:
        r = r.float()
    names = kernel_names(lambda: BIAS_ADD(x, b, r))
    assert not any("cutlassfuse" in n for n in names), names
    out = BIAS_ADD(x, b, r)
    assert out.dtype == eager(x, b, r).dtype and torch.equal(out, eager(x, b, r))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_recorded_calls_run_the_kernel_with_atens_gradients(memory_format):
    x, b, r = (t.requires_grad_() for t in case(SHAPES["video"], torch.float32, memory_format))
    names = kernel_names(lambda: BIAS_ADD(x, b, r))
    assert any("bias_add_kernel" in n for n in names) and not any("elementwise_kernel" in n for n in names), names
    out = BIAS_ADD(x, b, r)
    assert out.grad_fn.name() == "CutlassfuseBiasAddBackward" and torch.equal(out, eager(x, b, r))
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, (x, b, r), grad)
    theirs = torch.autograd.grad(eager(x, b, r), (x, b, r), grad)
    for got, expected in zip(ours, theirs, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-5)
    # gradcheck's Jacobians grow with the square of the size: a small case in float64
    x64, b64, r64 = (t.requires_grad_() for t in case((1, 4, 2, 3, 4), torch.float64, memory_format))
    assert torch.autograd.gradcheck(lambda *a: BIAS_ADD(*a), (x64, b64, r64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda t: str(t)[6:])
def test_fused_resnet_tail_adds_with_the_kernel(dtype):
    model = ResnetTail().to("cuda", dtype).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    x = torch.randn(1, 8, 4, 16, 16, device="cuda", dtype=dtype)
    with torch.no_grad():
        names = kernel_names(lambda: result.model(x))
        exact = ResnetTail().double().cuda().eval()
        exact.load_state_dict(model.state_dict())
        reference = exact(x.double())
        ours, theirs = ((m(x).double() - reference).abs().max() for m in (result.model, model))
    assert sum("bias_add_kernel" in n for n in names) == 3, names
    assert ours <= 2 * theirs + 1e-3


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda t: str(t)[6:])
def test_kernel_mode_adds_a_convolutions_bias_with_the_kernel(dtype, memory_format):
    conv = torch.nn.Conv3d(16, 32, 3, padding=1).to("cuda", dtype).to(memory_format=memory_format)
    x = torch.randn(1, 16, 4, 8, 8, device="cuda", dtype=dtype).contiguous(memory_format=memory_format)
    with torch.no_grad():
        expected = conv(x)
        with KernelMode():
            names = kernel_names(lambda: conv(x))
            out = conv(x)
    assert torch.equal(out, expected) and out.is_contiguous(memory_format=memory_format)
    assert sum("bias_add_kernel" in n for n in names) == 1, names
    assert not any("elementwise_kernel" in n for n in names), names
