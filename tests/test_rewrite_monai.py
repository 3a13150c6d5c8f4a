"""cutlassfuse.fuse on MONAI's 3-D networks (skipped where MONAI is not installed): the
blocks each becomes, the BatchNorm3d folded in eval mode, float64 outputs equal to the
original's, checkpoints both ways (of folded models: the original's into the folded)."""

from collections import Counter

import pytest
import torch
from torch._prims_common import suggest_memory_format

import cutlassfuse
from cutlassfuse.few_channel_conv import FewChannelConv3d

from fuse_checks import assert_checkpoints_load_both_ways, assert_folded_checkpoints_load, randomized

nets = pytest.importorskip("monai.networks.nets")

# The network, its input's shape, and the blocks fuse() makes of it.
NETWORKS = {
    # Convolution(conv, ADN(InstanceNorm3d, Dropout(0), PReLU)) in nn.Sequentials, ResidualUnits
    # around some, the decoder's ConvTranspose3d included.
    "UNet": (lambda: nets.UNet(3, 1, 2, channels=(4, 8, 8), strides=(2, 2), num_res_units=1), (1, 1, 8, 8, 8),
             {"Conv3dNormActivation": 4, "ConvTranspose3dNormActivation": 2}),
    # TwoConv: two Convolutions (InstanceNorm3d, LeakyReLU(0.1)) per level; the upsampling
    # ConvTranspose3d has no norm.
    "BasicUNet": (lambda: nets.BasicUNet(3, 1, 2, features=(4, 4, 8, 8, 16, 4)), (1, 1, 32, 32, 32),
                  {"Conv3dNormActivation": 18}),
    # UnetResBlock in forward() code: conv -> norm -> LeakyReLU, conv -> norm before the residual
    # sum, the residual's conv -> norm; UnetBasicBlock in the decoder.
    "DynUNet": (lambda: nets.DynUNet(3, 1, 2, kernel_size=[3, 3, 3], strides=[1, 2, 2], upsample_kernel_size=[2, 2],
                                     filters=[4, 8, 16], res_block=True), (1, 1, 8, 8, 8),
                {"Conv3dNormActivation": 13}),
    # ResBlock: GroupNorm -> ReLU on the block's input (which the residual reads too), then
    # conv -> GroupNorm -> ReLU; the head's GroupNorm -> ReLU.
    "SegResNet": (lambda: nets.SegResNet(3, init_filters=8, in_channels=1, out_channels=2, blocks_down=(1, 2),
                                         blocks_up=(1,)), (1, 1, 8, 8, 8),
                  {"GroupNormActivation": 5, "Conv3dNormActivation": 4}),
}


def fused_blocks(model: torch.nn.Module) -> Counter:
    return Counter(type(m).__name__ for m in model.modules()
                   if type(m).__module__.startswith("cutlassfuse.") and not isinstance(m, FewChannelConv3d))


def assert_fused_convolutions_write_channels_last(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Every fused convolution of the channels-last model writes channels-last, the first
    layers on the one-channel input too (a 1x1x1 one's weight has no channels-last strides)."""
    written = {}
    hooks = [module.register_forward_hook(lambda module, args, out, path=path: written.update({path: out}))
             for path, module in model.named_modules() if type(module).__name__.startswith("Conv")
             and type(module).__module__.startswith("cutlassfuse.")]
    model(x)
    for hook in hooks:
        hook.remove()
    assert written
    assert [path for path, out in written.items() if suggest_memory_format(out) != torch.channels_last_3d] == []


@pytest.mark.parametrize("name", NETWORKS)
def test_monai_network(name):
    make, shape, expected_blocks = NETWORKS[name]
    model = randomized(make().double(), seed=0)
    x = torch.rand(shape, dtype=torch.float64)
    expected = model(x)
    result = cutlassfuse.fuse(model)
    assert fused_blocks(result.model) == expected_blocks, str(result)
    assert result.left_alone == [], str(result)
    # Every network traced whole (BasicUNet's UpCat through its stand-in), its activations
    # channels-last.
    assert result.not_traced is None and result.channels_last
    # Channels-last: every convolution weight in the strides PyTorch reads as
    # channels_last_3d, a one-channel weight too (it would otherwise read as NCDHW and make
    # its convolution write NCDHW); only a (C_out, 1, 1, 1, 1) weight has no such strides.
    weights = [p for p in result.model.parameters() if p.dim() == 5 and p[0].numel() > 1]
    assert weights and all(suggest_memory_format(w) == torch.channels_last_3d for w in weights)
    assert_fused_convolutions_write_channels_last(result.model, x)
    torch.testing.assert_close(result.model(x), expected, rtol=1e-10, atol=1e-10)
    assert_checkpoints_load_both_ways(lambda: make().double(), (x,))


@pytest.mark.parametrize("name", NETWORKS)
def test_monai_network_fused_compiles_and_exports_as_one_graph(name):
    """torch.compile traces the fused model as one graph, and torch.export exports it (the
    output's layout conversion included): the fused blocks' Python adds no graph break, and BasicUNet's
    UpCat, whose torch.jit.isinstance breaks the original's graph, runs as its stand-in."""
    make, shape, _ = NETWORKS[name]
    model = make().eval()
    x = torch.rand(shape)
    with torch.no_grad():
        expected = model(x)
        if name == "BasicUNet":
            assert torch._dynamo.explain(model)(x).break_reasons
        fused = cutlassfuse.fuse(model).model
        torch._dynamo.reset()
        compiled = torch.compile(fused, fullgraph=True, backend="eager")(x)
        exported = torch.export.export(fused, (x,)).module()(x)
    for out in (compiled, exported):
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert out.is_contiguous()


# MONAI's networks with BatchNorm3d: the network, its input's shape, the blocks fuse() makes of
# it, and the norms it folds into their convolution in eval mode.
BATCH_NORM_NETWORKS = {
    # ConvBlock and UpConv: Convolution(conv, ADN(BatchNorm3d, Dropout(0), ReLU)); the attention gates'
    # Convolution(conv) -> BatchNorm3d (-> Sigmoid); the merging Convolutions' InstanceNorm3d -> PReLU fuse.
    "AttentionUnet": (lambda: nets.AttentionUnet(3, 1, 2, channels=(4, 8, 16), strides=(2, 2)), (1, 1, 16, 16, 16),
                      {"Conv3dNormActivation": 2}, 14),
    # LUConv: Convolution(conv, ADN(BatchNorm3d)), its activation in forward() code; the down and up
    # transitions' conv -> BatchNorm3d -> ELU in forward() code. Its channels (16 to 256) are fixed.
    "VNet": (lambda: nets.VNet(3, 1, 2), (1, 1, 16, 16, 16), {}, 24),
}


@pytest.mark.parametrize("name", BATCH_NORM_NETWORKS)
def test_monai_batch_norm_folds_in_eval_mode(name):
    make, shape, expected_blocks, folds = BATCH_NORM_NETWORKS[name]
    model = randomized(make().double(), seed=0)
    x = torch.rand(shape, dtype=torch.float64)
    expected = model(x)
    result = cutlassfuse.fuse(model)
    assert fused_blocks(result.model) == expected_blocks, str(result)
    assert len(result.folded) == folds and result.left_alone == [], str(result)
    assert not any(isinstance(m, torch.nn.BatchNorm3d) for m in result.model.modules())
    # Folding reorders float64 roundings through every folded layer, and VNet's outputs reach
    # 1e11: within 1e-9 of the largest output, not of each element (an element near a
    # cancellation keeps the absolute error of the largest).
    torch.testing.assert_close(result.model(x), expected, rtol=0, atol=1e-9 * expected.abs().max().item())


def test_monai_attention_unet_checkpoint_loads_into_the_folded_model():
    """Its fused blocks' keys and its folded convs' at once (VNet's 45M parameters would
    take seconds more)."""
    make, shape, _, _ = BATCH_NORM_NETWORKS["AttentionUnet"]
    assert_folded_checkpoints_load(lambda: make().double(), (torch.rand(shape, dtype=torch.float64),))


@pytest.mark.parametrize("name", BATCH_NORM_NETWORKS)
def test_monai_batch_norm_stays_in_training_mode(name):
    make, _, expected_blocks, folds = BATCH_NORM_NETWORKS[name]
    result = cutlassfuse.fuse(make().train())
    assert fused_blocks(result.model) == expected_blocks and result.folded == []
    assert len(result.left_alone) == folds, str(result)
    assert all(line.endswith(": BatchNorm3d in training mode uses batch statistics") for line in result.left_alone)


def test_monai_dropout_stays_between_norm_and_activation():
    """With dropout, MONAI's ADN runs norm, dropout, activation: the conv fuses with the
    norm, the activation stays behind the dropout."""
    model = randomized(nets.BasicUNet(3, 1, 2, features=(4, 4, 8, 8, 16, 4), dropout=0.1).double(), seed=0)
    x = torch.rand(1, 1, 32, 32, 32, dtype=torch.float64)
    expected = model(x)
    result = cutlassfuse.fuse(model)
    assert fused_blocks(result.model) == {"Conv3dNormActivation": 18}
    assert len(result.left_alone) == 18
    assert all(line.endswith(".adn.D: Dropout(p=0.1) between norm and activation") for line in result.left_alone)
    assert result.model.conv_0.conv_0.conv.activation_before_norm is False
    torch.testing.assert_close(result.model(x), expected, rtol=1e-10, atol=1e-10)


def test_monai_swish_modules_compute_silu():
    from monai.networks.blocks.activation import MemoryEfficientSwish, Swish

    from cutlassfuse.blocks import activation_of_module

    x = torch.randn(64, dtype=torch.float64)
    for module in (Swish(), MemoryEfficientSwish()):
        assert activation_of_module(module)[0] == "silu"
        torch.testing.assert_close(module(x), torch.nn.functional.silu(x))
    with pytest.raises(ValueError, match="not one the fused blocks compute"):
        activation_of_module(Swish(alpha=2.0))
