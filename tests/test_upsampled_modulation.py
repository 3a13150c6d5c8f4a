"""torch.ops.cutlassfuse.upsampled_modulation on the CPU (ATen's ops: the op's reference)
against float64 formulas, its fake kernel, errors and gradients; and fuse() running
CogVideoX's resnets' norms with their SiLU on it."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.library_modules import FusedCogVideoXSpatialNorm3D

MODULATION = torch.ops.cutlassfuse.upsampled_modulation.default
CL = torch.channels_last_3d
ACTIVATIONS = {"identity": (0.0, lambda x: x), "silu": (0.0, F.silu),
               "leaky_relu": (0.2, lambda x: F.leaky_relu(x, 0.2)),
               "gelu_tanh": (0.0, lambda x: F.gelu(x, approximate="tanh")), "elu": (0.5, lambda x: F.elu(x, 0.5))}
# (input D, H, W), (scale D, H, W), causal frames
GRIDS = {"powers_of_two": ((4, 8, 12), (2, 2, 3), False), "same_size": ((2, 3, 5), (2, 3, 5), False),
         "factor_three": ((3, 6, 6), (1, 2, 2), False), "uneven": ((5, 7, 9), (2, 3, 4), False),
         "causal": ((9, 8, 8), (3, 2, 2), True), "causal_one_frame": ((1, 4, 4), (1, 2, 2), True)}


def upsampled(t, size, causal):
    """Nearest upsampling as F.interpolate(size=...) computes it, the first frame apart with
    causal frames."""
    if not causal or size[0] == 1:
        return F.interpolate(t[:, :, :1] if causal else t, size=size)
    first = F.interpolate(t[:, :, :1], size=(1, *size[1:]))
    return torch.cat([first, F.interpolate(t[:, :, 1:], size=(size[0] - 1, *size[1:]))], dim=2)


def case(grid, dtype=torch.float64, memory_format=torch.contiguous_format, channels=8):
    size, small, causal = GRIDS[grid]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, channels, *size, generator=g, dtype=dtype).contiguous(memory_format=memory_format)
    scale, shift = (torch.randn(2, channels, *small, generator=g, dtype=dtype).contiguous(memory_format=memory_format)
                    for _ in range(2))
    return x, scale, shift, causal


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("grid", list(GRIDS))
def test_op_modulates_by_the_upsampled_tensors(grid, activation, memory_format):
    x, scale, shift, causal = case(grid, memory_format=memory_format)
    parameter, act = ACTIVATIONS[activation]
    out = MODULATION(x, scale, shift, causal, activation, parameter)
    size = x.shape[2:]
    expected = act(x * upsampled(scale, size, causal) + upsampled(shift, size, causal))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    assert out.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("grid", ["powers_of_two", "causal"])
def test_opcheck(grid):
    x, scale, shift, causal = case(grid, torch.float32)
    torch.library.opcheck(MODULATION, (x, scale, shift, causal, "silu", 0.0))


def test_gradients_are_the_formulas():
    g = torch.Generator().manual_seed(0)
    x, scale, shift = (torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
                       for shape in [(1, 2, 3, 2, 2), (1, 2, 2, 1, 1), (1, 2, 2, 1, 1)])
    causal = True  # frame 0 from frame 0, frames 1 and 2 from frame 1
    out = MODULATION(x, scale, shift, causal, "silu", 0.0)
    assert out.grad_fn.name() == "CutlassfuseUpsampledModulationBackward"  # the op's kernel ran, its node recorded
    call = lambda *a: MODULATION(*a, causal, "silu", 0.0)  # noqa: E731
    assert torch.autograd.gradcheck(call, (x, scale, shift))
    assert torch.autograd.gradgradcheck(call, (x, scale, shift))
    assert torch.autograd.gradcheck(call, (x.detach(), scale, shift.detach()))


@pytest.mark.parametrize(("change", "message"), [
    (lambda x, s, b: (x[0], s, b), "input must be 5-D"),
    (lambda x, s, b: (x, s, b[:, :, :1]), "scale and shift must be 5-D tensors of one shape"),
    (lambda x, s, b: (x, s[:, :4], b[:, :4]), "the input's batch and channels"),
    (lambda x, s, b: (x, s.float(), b), "the input's type"),
], ids=["rank", "shapes", "channels", "type"])
def test_invalid_calls_raise(change, message):
    x, scale, shift, causal = case("powers_of_two")
    with pytest.raises(RuntimeError, match=message):
        MODULATION(*change(x, scale, shift), causal, "identity", 0.0)


@pytest.mark.parametrize("activation", ["prelu", "tanh"])
def test_activations_it_does_not_compute_raise(activation):
    x, scale, shift, causal = case("powers_of_two")
    with pytest.raises(RuntimeError, match="activation must be one of"):
        MODULATION(x, scale, shift, causal, activation, 0.0)


cogvideox = pytest.importorskip("diffusers.models.autoencoders.autoencoder_kl_cogvideox")


def small_cogvideox_decoder() -> nn.Module:
    torch.manual_seed(0)
    from diffusers import AutoencoderKLCogVideoX

    vae = AutoencoderKLCogVideoX(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1)
    return vae.decoder.eval()


def test_fuse_gives_cogvideoxs_resnet_norms_their_silu():
    decoder = small_cogvideox_decoder()
    result = cutlassfuse.fuse(copy.deepcopy(decoder))
    resnets = [m for m in result.model.modules() if isinstance(m, cogvideox.CogVideoXResnetBlock3D)]
    assert resnets and all(isinstance(m.nonlinearity, nn.Identity) for m in resnets)
    assert all(isinstance(m.norm1.activation, nn.SiLU) and isinstance(m.norm2.activation, nn.SiLU) for m in resnets)
    norms = [m for m in result.model.modules() if isinstance(m, FusedCogVideoXSpatialNorm3D)]
    # and the decoder's last norm, which a SiLU of the decoder's own follows, without one
    assert len(norms) == 2 * len(resnets) + 1
    assert sum(isinstance(m.activation, nn.Identity) for m in norms) == 1
    assert result.model.state_dict().keys() == decoder.state_dict().keys()
    z = torch.randn(1, 16, 3, 4, 4)
    with torch.no_grad():
        expected = copy.deepcopy(decoder).double()(z.double())[0]
        errors = [(m(z)[0].double() - expected).abs().max().item() for m in (decoder, result.model)]
    assert errors[1] <= 4 * errors[0] + 1e-6, errors


def test_a_resnet_with_a_time_embedding_keeps_its_nonlinearity():
    torch.manual_seed(0)
    resnet = cogvideox.CogVideoXResnetBlock3D(8, 8, temb_channels=4, groups=4, spatial_norm_dim=4)
    model = nn.ModuleList([resnet])
    cutlassfuse.library_modules.replace_library_modules(model)
    assert isinstance(model[0].nonlinearity, nn.SiLU)
    assert isinstance(model[0].norm1, FusedCogVideoXSpatialNorm3D)
    assert isinstance(model[0].norm1.activation, nn.Identity)
