"""On the GPU: FrameGroupNormActivation normalizes each frame with cutlassfuse's norm
kernels (every output element written, channels-last out, no closer to float64 than
PyTorch's per-frame GroupNorm is not), and fuse() runs diffusers' Mochi decoder with it
(no ATen GroupNorm and no concatenation of normalized chunks left) and CogVideoX's spatial
norms' GroupNorms on cutlassfuse's norm."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.testing import poison_cuda_allocator
from test_library_modules import frame_norm, frames_reference, small_cogvideox_decoder, small_mochi_decoder  # tests/
from test_replication_pad_cuda import kernel_names  # tests/gpu

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
ATEN_GROUP_NORM = "RowwiseMoments"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_frame_norm_runs_the_norm_kernels(memory_format, dtype):
    module = frame_norm(nn.SiLU(), channels=64, groups=32).cuda()
    x64 = torch.randn(2, 64, 5, 16, 24, device="cuda", dtype=torch.float64).contiguous(memory_format=memory_format)
    expected = frames_reference(module, F.silu, x64)
    ours, theirs = copy.deepcopy(module).to(dtype), copy.deepcopy(module).to(dtype)
    x = x64.to(dtype)
    poison_cuda_allocator(x.numel() * x.element_size())
    with torch.no_grad():
        names = kernel_names(lambda: ours(x))
        out = ours(x)
        eager = frames_reference(theirs, F.silu, x)
    assert not out.isnan().any() and out.is_contiguous(memory_format=CL)
    assert not any(ATEN_GROUP_NORM in n for n in names), names
    ours_error = (out.double() - expected).abs().max().item()
    eager_error = (eager.double() - expected).abs().max().item()
    assert ours_error <= 1.25 * eager_error + 1e-6, (ours_error, eager_error)


def test_fused_mochi_decoder_normalizes_frames_with_the_kernels():
    decoder = small_mochi_decoder().cuda()
    result = cutlassfuse.fuse(copy.deepcopy(decoder).half())
    z = torch.randn(1, 12, 2, 8, 8, device="cuda")
    with torch.no_grad():
        names = kernel_names(lambda: result.model(z.half()))
        expected = copy.deepcopy(decoder).double()(z.double())[0]
        fused = result.model(z.half())[0]
        eager = decoder.half()(z.half())[0]
    assert not any(ATEN_GROUP_NORM in n or "CatArrayBatchedCopy" in n for n in names), names
    fused_error = (fused.double() - expected).abs().max().item()
    eager_error = (eager.double() - expected).abs().max().item()
    assert fused_error <= 1.5 * eager_error + 1e-4, (fused_error, eager_error)


def test_fused_cogvideox_decoder_normalizes_with_the_kernels():
    decoder = small_cogvideox_decoder().cuda()
    result = cutlassfuse.fuse(copy.deepcopy(decoder).half())
    z = torch.randn(1, 16, 3, 8, 8, device="cuda")
    with torch.no_grad():
        names = kernel_names(lambda: result.model(z.half()))
        expected = copy.deepcopy(decoder).double()(z.double())[0]
        fused = result.model(z.half())[0]
        eager = decoder.half()(z.half())[0]
    assert not any(ATEN_GROUP_NORM in n for n in names), names
    fused_error = (fused.double() - expected).abs().max().item()
    eager_error = (eager.double() - expected).abs().max().item()
    assert fused_error <= 1.5 * eager_error + 1e-4, (fused_error, eager_error)
