"""FrameGroupNormActivation (a GroupNorm of each frame of a video tensor, with its
activation) against F.group_norm of the frames, and fuse() replacing diffusers' Mochi
per-frame norms and resnet blocks with it and CogVideoX's spatial norms with
FusedCogVideoXSpatialNorm3D: the decoders' values, their checkpoint keys, only the forward()
code it was written against (diffusers' tests skipped where diffusers is not installed)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse import FrameGroupNormActivation, GroupNormActivation, library_modules
from cutlassfuse.library_modules import FusedCogVideoXSpatialNorm3D

CL = torch.channels_last_3d


def frame_norm(activation: nn.Module, channels: int = 8, groups: int = 4) -> FrameGroupNormActivation:
    torch.manual_seed(0)
    norm = nn.GroupNorm(groups, channels)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    return FrameGroupNormActivation(GroupNormActivation.from_modules(norm, activation)).double()


def frames_reference(module: FrameGroupNormActivation, activation, x: torch.Tensor) -> torch.Tensor:
    """Each frame normalized on its own, as diffusers' MochiChunkedGroupNorm3D does."""
    n, c, t, h, w = x.shape
    norm = module.block.norm
    frames = x.transpose(1, 2).reshape(n * t, c, h, w)
    out = activation(F.group_norm(frames, norm.num_groups, norm.weight, norm.bias, norm.eps))
    return out.reshape(n, t, c, h, w).transpose(1, 2)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("activation", [nn.Identity(), nn.SiLU()], ids=["identity", "silu"])
@pytest.mark.parametrize("shape", [(2, 8, 3, 4, 5), (1, 8, 1, 3, 3)], ids=["frames", "one_frame"])
def test_frame_norm_normalizes_each_frame(shape, activation, memory_format):
    module = frame_norm(activation)
    x = torch.randn(shape, dtype=torch.float64).contiguous(memory_format=memory_format)
    with torch.no_grad():
        out = module(x)
    torch.testing.assert_close(out, frames_reference(module, activation, x), rtol=1e-12, atol=1e-12)
    assert out.is_contiguous(memory_format=CL)


def test_frame_norm_gradients_match_the_frames_norm():
    module = frame_norm(nn.SiLU(), channels=4, groups=2)
    x = torch.randn(1, 4, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


def test_frame_norm_explains_its_frames_call():
    module = frame_norm(nn.SiLU())
    x = torch.randn(2, 8, 3, 4, 5, dtype=torch.float64)
    assert module.explain(x) == module.block.explain(module._frames(x))
    assert isinstance(module.explain(x), str) and module.explain(x)


def test_frame_norm_refuses_other_ranks():
    with pytest.raises(ValueError, match=r"takes \(N, C, T, H, W\)"):
        frame_norm(nn.SiLU())(torch.randn(2, 8, 4, 5, dtype=torch.float64))


def errors_against_float64(decoder: nn.Module, fused: nn.Module, z: torch.Tensor) -> list[float]:
    """The max abs errors of a diffusers decoder and its fused model (each returning the
    decoded tensor first) on ``z``, against a float64 copy of the decoder."""
    with torch.no_grad():
        expected = copy.deepcopy(decoder).double()(z.double())[0]
        return [(model(z)[0].double() - expected).abs().max().item() for model in (decoder, fused)]


mochi = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_mochi")


def small_mochi_decoder() -> nn.Module:
    torch.manual_seed(0)
    from diffusers import AutoencoderKLMochi

    vae = AutoencoderKLMochi(decoder_block_out_channels=(32, 32, 64, 64), layers_per_block=(1, 1, 1, 1, 1))
    return vae.decoder.eval()


def test_fuse_replaces_mochis_frame_norms_and_their_activations():
    decoder = small_mochi_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder))
    resnets = [path for path, m in decoder.named_modules() if isinstance(m, mochi.MochiResnetBlock3D)]
    assert [line.split(":")[0] for line in result.library_modules] == resnets, str(result)
    assert "5 library module(s) replaced" in str(result).splitlines()[0]
    assert not any(isinstance(m, mochi.MochiChunkedGroupNorm3D) for m in result.model.modules())
    assert all(isinstance(m.nonlinearity, nn.Identity) for m in result.model.modules()
               if isinstance(m, mochi.MochiResnetBlock3D))
    assert result.model.state_dict().keys() == decoder.state_dict().keys()
    eager_error, fused_error = errors_against_float64(decoder, result.model, torch.randn(1, 12, 2, 4, 4))
    assert fused_error <= 4 * eager_error + 1e-6
    decoder.load_state_dict(result.model.state_dict())


def test_a_changed_forward_keeps_the_library_module():
    norm = mochi.MochiChunkedGroupNorm3D(8, num_groups=4)

    class Edited(type(norm)):
        def forward(self, x=None):
            return super().forward(x) * 2

    Edited.__module__, Edited.__qualname__ = type(norm).__module__, type(norm).__qualname__
    model = nn.Sequential(Edited(8, num_groups=4))
    result = cutlassfuse.fuse(model)
    assert result.library_modules == []
    assert not any(isinstance(m, FrameGroupNormActivation) for m in result.model.modules())


cogvideox = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_cogvideox")


def small_cogvideox_decoder() -> nn.Module:
    torch.manual_seed(0)
    from diffusers import AutoencoderKLCogVideoX

    vae = AutoencoderKLCogVideoX(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1)
    return vae.decoder.eval()


@pytest.mark.parametrize("frames", [1, 2, 3], ids=["one", "two", "three"])
def test_fuse_replaces_cogvideoxs_spatial_norms(frames):
    decoder = small_cogvideox_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder))
    norms = [path for path, m in decoder.named_modules() if isinstance(m, cogvideox.CogVideoXSpatialNorm3D)]
    # each resnet replaces its two norms; the decoder's last norm is replaced on its own
    resnets = [path for path, m in decoder.named_modules() if isinstance(m, cogvideox.CogVideoXResnetBlock3D)]
    norm_lines = [line for line in result.library_modules if ": CogVideoXCausalConv3d:" not in line]
    assert sorted(line.split(":")[0] for line in norm_lines) == sorted([*resnets, "norm_out"]), str(result)
    replaced = [m for m in result.model.modules() if isinstance(m, cogvideox.CogVideoXSpatialNorm3D)
                or isinstance(m, FusedCogVideoXSpatialNorm3D)]
    assert len(replaced) == len(norms) and all(isinstance(m, FusedCogVideoXSpatialNorm3D) for m in replaced)
    assert result.model.state_dict().keys() == decoder.state_dict().keys()
    eager_error, fused_error = errors_against_float64(decoder, result.model, torch.randn(1, 16, frames, 4, 4))
    assert fused_error <= 4 * eager_error + 1e-6
    decoder.load_state_dict(result.model.state_dict())


def test_fuse_runs_cogvideoxs_decoder_channels_last_on_request():
    decoder = small_cogvideox_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder), channels_last=True)
    assert result.channels_last and not result.replaced
    assert all(p.is_contiguous(memory_format=CL) for p in result.model.parameters() if p.dim() == 5)
    z = torch.randn(1, 16, 3, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(result.model(z)[0], decoder(z)[0], rtol=1e-4, atol=1e-5)


def spatial_norm(kernel_size: int = 1) -> nn.Module:
    torch.manual_seed(0)
    norm = cogvideox.CogVideoXSpatialNorm3D(8, 4, groups=4)
    if kernel_size != 1:
        norm.conv_y = cogvideox.CogVideoXCausalConv3d(4, 8, kernel_size=kernel_size)
    nn.init.normal_(norm.norm_layer.weight)
    nn.init.normal_(norm.norm_layer.bias)
    return norm.double()


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("shapes", [((5, 8, 12), (3, 2, 3)), ((4, 4, 4), (2, 4, 4)), ((3, 6, 6), (3, 2, 2))],
                         ids=["odd_frames_powers_of_two", "even_frames_same_size", "factor_three"])
def test_spatial_norm_matches_the_librarys(shapes, memory_format):
    (t, h, w), (zt, zh, zw) = shapes
    original = spatial_norm()
    fused = FusedCogVideoXSpatialNorm3D(copy.deepcopy(original))
    f = torch.randn(2, 8, t, h, w, dtype=torch.float64).contiguous(memory_format=memory_format)
    zq = torch.randn(2, 4, zt, zh, zw, dtype=torch.float64)
    with torch.no_grad():
        out, cache = fused(f, zq)
        expected, _ = original(f, zq)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert out.is_contiguous(memory_format=memory_format)
    assert cache == {"conv_y": None, "conv_b": None}


def test_spatial_norm_upsamples_powers_of_two_by_broadcasting(monkeypatch):
    fused = FusedCogVideoXSpatialNorm3D(spatial_norm())
    f, zq = torch.randn(1, 8, 5, 8, 8, dtype=torch.float64), torch.randn(1, 4, 3, 2, 4, dtype=torch.float64)
    expected, _ = fused(f, zq)

    def modulation(*args, **kwargs):  # on the CPU: ATen's ops, the upsampled tensors written out
        raise AssertionError("a full-size upsampling of the latent's convolutions")

    monkeypatch.setattr(library_modules, "UPSAMPLED_MODULATION", modulation)
    torch.testing.assert_close(fused(f, zq)[0], expected, rtol=0, atol=0)  # grad mode: the parameters' graph
    with torch.no_grad():
        torch.testing.assert_close(fused(f, zq)[0], expected, rtol=0, atol=0)


def test_spatial_norm_gradients_match_the_librarys():
    fused = FusedCogVideoXSpatialNorm3D(spatial_norm())
    f = torch.randn(1, 8, 3, 2, 2, dtype=torch.float64, requires_grad=True)
    zq = torch.randn(1, 4, 2, 1, 1, dtype=torch.float64, requires_grad=True)  # both parts broadcast
    assert torch.autograd.gradcheck(lambda f, zq: fused(f, zq)[0], (f, zq))
    assert torch.autograd.gradgradcheck(lambda f, zq: fused(f, zq)[0], (f, zq))


def test_spatial_norm_with_other_convolutions_keeps_its_modulation():
    model = nn.ModuleList([spatial_norm(kernel_size=3)])
    lines = library_modules.replace_library_modules(model)
    assert type(model[0]) is cogvideox.CogVideoXSpatialNorm3D
    assert [line.split(": ")[1] for line in lines] == ["CogVideoXSpatialNorm3D", "CogVideoXCausalConv3d",
                                                        "CogVideoXCausalConv3d"]  # its conv_y and conv_b
    assert isinstance(model[0].norm_layer, GroupNormActivation)


@pytest.mark.parametrize("kernel_size", [3, 1])
def test_causal_convolution_matches_the_librarys_over_two_calls(kernel_size):
    torch.manual_seed(0)
    original = cogvideox.CogVideoXCausalConv3d(4, 6, kernel_size=kernel_size, pad_mode="first").double()
    fused = library_modules.FusedCogVideoXCausalConv3d(copy.deepcopy(original))
    cache, expected_cache = None, None
    for frames in (3, 2):  # a first call pads with its first frame, the next reads the cache
        x = torch.randn(1, 4, frames, 5, 5, dtype=torch.float64)
        (out, cache), (expected, expected_cache) = fused(x, cache), original(x, expected_cache)
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        if kernel_size > 1:
            assert torch.equal(cache, expected_cache)
        else:  # nothing reads a 1x1x1 convolution's cache
            assert cache is None
    assert fused.state_dict().keys() == original.state_dict().keys()


def test_fuse_puts_cogvideoxs_convolution_biases_on_bias_add_but_not_mochis():
    decoder = small_cogvideox_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder))
    # (the spatial norms' 1x1x1 convolutions, conv_y and conv_b, run at the latent's resolution)
    convs = [path for path, m in decoder.named_modules() if isinstance(m, cogvideox.CogVideoXCausalConv3d)
             and path.rsplit(".", 1)[-1] not in ("conv_y", "conv_b")]
    replaced = [line.split(":")[0] for line in result.library_modules if ": CogVideoXCausalConv3d:" in line]
    assert sorted(replaced) == sorted(convs) and convs, str(result)
    mochi_result = cutlassfuse.fuse(copy.deepcopy(small_mochi_decoder()))  # replicate pads: left to the trace
    assert not any("CogVideoXCausalConv3d" in line for line in mochi_result.library_modules)


wan = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_wan")


def small_wan_vae() -> nn.Module:
    torch.manual_seed(0)
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(base_dim=32, num_res_blocks=1).double().eval()
    with torch.no_grad():  # norms' affine and the convolutions' biases away from their initial values
        for name, p in vae.named_parameters():
            if "gamma" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return vae


@pytest.mark.parametrize("channels_last", [False, True], ids=["input_layout", "channels_last"])
def test_fuse_replaces_wans_norms_and_causal_convolutions(channels_last):
    vae = small_wan_vae()
    result = cutlassfuse.fuse(copy.deepcopy(vae.decoder), channels_last=channels_last)
    model = result.model
    assert not any(isinstance(m, (wan.WanRMS_norm, wan.WanCausalConv3d)) for m in model.modules())
    resnets = [m for m in model.modules() if isinstance(m, wan.WanResidualBlock)]
    assert resnets and all(isinstance(m.nonlinearity, nn.Identity) for m in resnets)
    assert all(m.norm1._activation_arguments == ("silu", 0.0) for m in resnets)
    assert model.state_dict().keys() == vae.decoder.state_dict().keys()
    fused = copy.deepcopy(vae)
    fused.decoder = model
    z = torch.randn(1, 16, 4, 4, 4, dtype=torch.float64)  # four chunks: the caches' every case
    with torch.no_grad():
        torch.testing.assert_close(fused.decode(z).sample, vae.decode(z).sample, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("kernel_size", "padding", "stride"), [(3, 1, 1), ((3, 1, 1), (1, 0, 0), 1), (1, 0, 1),
                                                                 (3, 1, (1, 2, 2))])
def test_wan_causal_convolution_matches_the_librarys(kernel_size, padding, stride):
    torch.manual_seed(0)
    original = wan.WanCausalConv3d(4, 6, kernel_size, stride=stride, padding=padding).double()
    fused = library_modules.FusedWanCausalConv3d(original)
    x = torch.randn(1, 4, 3, 5, 6, dtype=torch.float64)
    for cache in (None, x[:, :, -1:], x[:, :, -2:]):
        torch.testing.assert_close(fused(x, cache), original(x, cache), rtol=1e-12, atol=1e-12)


def test_wan_norm_keeps_the_librarys_type_promotion():
    torch.manual_seed(0)
    norm = wan.WanRMS_norm(8, images=False, bias=True)
    fused = library_modules.FusedWanRMSNorm(norm, nn.SiLU())
    x = torch.randn(2, 8, 3, 4, 4).half()
    with torch.no_grad():
        expected = F.silu(norm(x))  # float16 normalized values times float32 gamma: float32
        out = fused(x)
    assert out.dtype == expected.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=2e-3, atol=2e-3)
