"""On the GPU: torch.ops.cutlassfuse.replication_pad3d's copy kernel gives ATen's pad bit
for bit (every output element written, the input's layout) in both layouts and every
element size; calls outside its scope take ATen's pad, calls that autograd records the
kernel with ATen's derivative;
fuse() runs it in a video autoencoder's causal convolutions."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse.testing import poison_cuda_allocator

pytestmark = pytest.mark.gpu

PAD = torch.ops.cutlassfuse.replication_pad3d.default
CL = torch.channels_last_3d
CAUSAL = (1, 1, 1, 1, 2, 0)
PAD_GRID = "cutlassfuse::(anonymous namespace)::PadGrid"  # the pad's index map in the copy kernels' names

# (shape, padding): F.pad's order, W's pads first.
CASES = {
    "causal_16_channels": ((2, 16, 5, 12, 20), CAUSAL),
    "no_pads": ((1, 8, 3, 4, 5), (0, 0, 0, 0, 0, 0)),
    "pads_past_the_extent": ((1, 3, 2, 3, 1), (5, 7, 0, 9, 4, 3)),
    "long_rows": ((1, 2, 2, 3, 300), (1, 2, 3, 0, 0, 1)),
    # NCDHW rows of more than 48 KB in 4-byte and wider dtypes: past the shared-memory buffer.
    "rows_past_the_buffer": ((1, 1, 2, 2, 12500), (3, 2, 1, 0, 0, 1)),
    "one_pixel": ((3, 5, 1, 1, 1), (2, 2, 2, 2, 2, 2)),
    "odd_channels": ((2, 3, 4, 7, 9), (1, 1, 1, 1, 2, 0)),
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.complex128]


def case_input(name, dtype, memory_format):
    shape, padding = CASES[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=torch.float64, generator=g) * 50
    x = torch.complex(x, -x) if dtype.is_complex else x
    return x.to(dtype).contiguous(memory_format=memory_format), list(padding)


def kernel_names(call):
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        call()
        torch.cuda.synchronize()
    return [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("name", list(CASES))
def test_kernel_gives_atens_pad_bitwise(name, memory_format, dtype):
    x, padding = case_input(name, dtype, memory_format)
    expected = F.pad(x, padding, mode="replicate")
    poison_cuda_allocator(4 * expected.numel() * expected.element_size())
    out = PAD(x, padding)
    torch.cuda.synchronize()
    assert out.shape == expected.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=suggest_memory_format(x))
    assert torch.equal(out, expected), "an element differs or was not written"


@pytest.mark.parametrize(
    ("memory_format", "dtype", "name", "kernel"),
    [
        (CL, torch.float16, "causal_16_channels", f"channels_last_gather_kernel<{PAD_GRID}"),
        (torch.contiguous_format, torch.float16, "causal_16_channels", "replication_pad_ncdhw_rows_kernel"),
        (torch.contiguous_format, torch.float16, "rows_past_the_buffer", "replication_pad_ncdhw_rows_kernel"),
        (torch.contiguous_format, torch.float32, "rows_past_the_buffer", f"channels_first_gather_kernel<{PAD_GRID}"),
    ],
    ids=["ndhwc", "ncdhw_rows", "ncdhw_long_rows_fp16", "ncdhw_long_rows_fp32"],
)
def test_the_copy_kernel_runs_not_atens(memory_format, dtype, name, kernel):
    x, padding = case_input(name, dtype, memory_format)
    names = kernel_names(lambda: PAD(x, padding))
    assert sum(kernel in n for n in names) == 1, names
    assert not any("replication_pad_forward" in n for n in names), names


@pytest.mark.parametrize("call", ["strided_view", "negative_pad", "unbatched", "bool"])
def test_calls_outside_the_kernel_take_atens_pad(call):
    x = torch.randn(2, 4, 5, 6, 7, device="cuda", dtype=torch.float16)
    padding = list(CAUSAL)
    if call == "strided_view":
        x = x[:, :, :, 1:5]
    elif call == "negative_pad":
        padding = [-1, 2, 0, 1, 1, -2]
    elif call == "unbatched":
        x = x[0]
    else:
        x = x > 0
        with pytest.raises(RuntimeError):
            F.pad(x, padding, mode="replicate")
        with pytest.raises(RuntimeError):
            PAD(x, padding)
        return
    names = kernel_names(lambda: PAD(x, padding))
    assert not any("cutlassfuse" in n for n in names), names
    assert torch.equal(PAD(x, padding), F.pad(x, padding, mode="replicate"))


def test_recorded_calls_run_the_kernel_with_atens_gradient():
    x = torch.randn(2, 8, 4, 5, 6, device="cuda", dtype=torch.float64, requires_grad=True)
    names = kernel_names(lambda: PAD(x, list(CAUSAL)))
    assert any(PAD_GRID in n or "replication_pad_ncdhw_rows" in n for n in names), names
    assert not any("replication_pad_forward" in n for n in names), names
    out = PAD(x, list(CAUSAL))
    assert out.grad_fn.name() == "CutlassfuseReplicationPad3DBackward"
    grad = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, x, grad)
    (atens,) = torch.autograd.grad(F.pad(x, CAUSAL, mode="replicate"), x, grad)
    # ATen's backward sums the border's gradients with atomics: in any order.
    assert torch.allclose(ours, atens, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        assert torch.equal(PAD(x, list(CAUSAL)), out)


class CausalResnetHalf(nn.Module):
    """GroupNorm -> SiLU -> causal Conv3d -> GroupNorm -> SiLU, as diffusers' video
    autoencoders write them."""

    def __init__(self, channels):
        super().__init__()
        self.norm1 = nn.GroupNorm(8, channels)
        self.conv = nn.Conv3d(channels, channels, 3)
        self.norm2 = nn.GroupNorm(8, channels)

    def forward(self, x):
        h = F.pad(F.silu(self.norm1(x)), CAUSAL, mode="replicate")
        return F.silu(self.norm2(self.conv(h)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda t: str(t)[6:])
def test_fused_causal_block_runs_the_pad_kernel(dtype):
    model = CausalResnetHalf(32).to("cuda").eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert len(result.replicate_pads) == 1 and len(result.replaced) == 2, str(result)
    fused, eager = result.model.to(dtype), model.to(dtype)
    x = torch.randn(1, 32, 5, 16, 16, device="cuda", dtype=dtype)
    with torch.no_grad():
        names = kernel_names(lambda: fused(x))
        assert any("replication_pad_" in n and "cutlassfuse" in n for n in names), names
        reference = copy.deepcopy(model).double()(x.double())
        error = (fused(x).double() - reference).abs().max().item()
        eager_error = (eager(x).double() - reference).abs().max().item()
    assert error <= 1.25 * eager_error, (error, eager_error)
