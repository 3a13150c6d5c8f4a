"""The traceable stand-in of diffusers' HunyuanVideoUpsampleCausal3D: the module's own values
bit for bit, in the input's layout, for every number of frames, and fuse() tracing the
HunyuanVideo decoder's upsampling blocks through it (skipped where diffusers is not
installed)."""

import copy

import pytest
import torch

import cutlassfuse
from cutlassfuse.kernel_mode import WithKernelMode
from cutlassfuse.traceable_forwards import causal_nearest_upsample, stand_in

diffusers = pytest.importorskip("diffusers")
hunyuan = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_hunyuan_video")

CL = torch.channels_last_3d


def upsampler(factors):
    torch.manual_seed(0)
    return hunyuan.HunyuanVideoUpsampleCausal3D(4, 6, upsample_factor=factors).double().eval()


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("frames", [1, 2, 5])
@pytest.mark.parametrize("factors", [(2, 2, 2), (1, 2, 2)], ids=["time_and_space", "space"])
def test_stand_in_gives_the_modules_values(factors, frames, memory_format):
    module = upsampler(factors)
    forward = stand_in(module)
    assert forward is not None
    x = torch.randn(2, 4, frames, 3, 5, dtype=torch.float64).contiguous(memory_format=memory_format)
    with torch.no_grad():
        expected, out = module(x), forward(module, x)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("factors", [(2, 2, 2), (1, 2, 2)], ids=["time_and_space", "space"])
def test_channels_last_upsampling_stays_channels_last(factors):
    x = torch.randn(1, 4, 3, 4, 5).contiguous(memory_format=CL)
    out = causal_nearest_upsample(x, factors)
    assert out.shape == (1, 4, 1 + factors[0] * 2, 8, 10) and out.is_contiguous(memory_format=CL)


def small_decoder():
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLHunyuanVideo(block_out_channels=(32, 32, 64, 64), norm_num_groups=8,
                                              layers_per_block=1)
    return vae.decoder.double().eval()


@pytest.mark.parametrize("channels_last", [False, True], ids=["input_layout", "channels_last"])
def test_fuse_traces_the_decoders_upsampling_blocks(channels_last):
    decoder = small_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder), channels_last=channels_last)
    # The mid-block attention is the one module whose code no trace reaches.
    assert [line.split(":")[0] for line in result.kernel_mode] == ["mid_block.attentions.0"], str(result)
    assert not any(isinstance(m, WithKernelMode) for name, m in result.model.named_modules() if "upsamplers" in name)
    assert sum("upsamplers.0.conv" in line for line in result.replicate_pads) == 3, str(result)
    x = torch.randn(1, 16, 3, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), decoder(x), rtol=1e-10, atol=1e-10)
