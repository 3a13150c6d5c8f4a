"""cutlassfuse.fuse on MONAI's 3-D networks (skipped where MONAI is not installed): the
blocks each becomes, float64 outputs equal to the original's, checkpoints both ways."""

from collections import Counter

import pytest
import torch

import cutlassfuse

from fuse_checks import assert_checkpoints_load_both_ways, randomized

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
    return Counter(type(m).__name__ for m in model.modules() if type(m).__module__.startswith("cutlassfuse."))


@pytest.mark.parametrize("name", NETWORKS)
def test_monai_network(name):
    make, shape, expected_blocks = NETWORKS[name]
    model = randomized(make().double(), seed=0)
    x = torch.rand(shape, dtype=torch.float64)
    expected = model(x)
    result = cutlassfuse.fuse(model)
    assert fused_blocks(result.model) == expected_blocks, str(result)
    assert result.left_alone == [], str(result)
    torch.testing.assert_close(result.model(x), expected, rtol=1e-10, atol=1e-10)
    assert_checkpoints_load_both_ways(lambda: make().double(), (x,))


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
