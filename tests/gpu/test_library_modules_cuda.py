"""On the GPU: FrameGroupNormActivation normalizes each frame with cutlassfuse's norm
kernels (every output element written, channels-last out, no closer to float64 than
PyTorch's per-frame GroupNorm is not), and fuse() runs diffusers' Mochi decoder with it
(no ATen GroupNorm and no concatenation of normalized chunks left) and CogVideoX's spatial
norms with their GroupNorms on cutlassfuse's norm and the latent's modulation broadcast
(channels-last: one upsampled_modulation pass each)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.testing import poison_cuda_allocator
from test_library_modules import (cogvideox, errors_against_float64, frame_norm, frames_reference,  # tests/
                                 small_cogvideox_decoder, small_mochi_decoder)
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


def fused_decoder_run(decoder: nn.Module, latent_channels: int, **fuse_options):
    """The fp16 decoder fused: the kernels of one call of the decoder and of the fused one,
    and their errors against float64."""
    decoder = decoder.cuda().half()
    result = cutlassfuse.fuse(copy.deepcopy(decoder), **fuse_options)
    z = torch.randn(1, latent_channels, 3, 8, 8, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        eager_names, names = kernel_names(lambda: decoder(z)), kernel_names(lambda: result.model(z))
    eager_error, fused_error = errors_against_float64(decoder, result.model, z)
    return eager_names, names, eager_error, fused_error


def test_fused_mochi_decoder_normalizes_frames_with_the_kernels():
    _, names, eager_error, fused_error = fused_decoder_run(small_mochi_decoder(), 12)
    assert not any(ATEN_GROUP_NORM in n or "CatArrayBatchedCopy" in n for n in names), names
    assert fused_error <= 1.5 * eager_error + 1e-4, (fused_error, eager_error)


@pytest.mark.parametrize("channels_last", [False, True], ids=["input_layout", "channels_last"])
def test_fused_cogvideox_decoder_normalizes_with_the_kernels(channels_last):
    decoder = small_cogvideox_decoder()
    norms = sum(isinstance(m, cogvideox.CogVideoXSpatialNorm3D) for m in decoder.modules())
    eager_names, names, eager_error, fused_error = fused_decoder_run(decoder, 16, channels_last=channels_last)
    assert not any(ATEN_GROUP_NORM in n for n in names), names
    # each causal convolution's bias on bias_add
    convs = sum(isinstance(m, cogvideox.CogVideoXCausalConv3d) and m.time_kernel_size > 1 for m in decoder.modules())
    assert sum("bias_add_kernel" in n for n in names) >= convs, names
    # The spatial norms' modulation reads the latent's convolutions through broadcasts: none
    # of them upsamples the latent (each does once or twice in the library's code; the
    # decoder's upsamplers remain).
    upsamplings = [sum("upsample_nearest3d" in n for n in run) for run in (eager_names, names)]
    assert upsamplings[1] <= upsamplings[0] - norms, upsamplings
    if channels_last:  # every convolution writes channels-last: cuDNN converts no output back
        assert not any("nhwcToNchw" in n for n in names), names
        # and the modulations (with the resnets' SiLU) run as one pass each
        assert sum("upsampled_modulation_kernel" in n for n in names) == norms, names
    assert fused_error <= 1.5 * eager_error + 1e-4, (fused_error, eager_error)
