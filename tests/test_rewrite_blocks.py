"""cutlassfuse.fuse on the block family's chains: conv -> norm -> activation and the
other orders in nn.Sequentials (nested ones too, as MONAI builds them) and in forward()
code (modules and functional forms), a norm -> activation with no conv in front, what is
left alone and why; float64 outputs equal to the original model's, the very parameters,
checkpoints loading both ways."""

import copy
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format

import cutlassfuse
from cutlassfuse import (
    Conv3dNormActivation,
    ConvTranspose3dNormActivation,
    ConvTranspose3dReLUGroupNorm,
    GroupNormActivation,
)
from cutlassfuse.blocks import activation_of_module

from fuse_checks import assert_checkpoints_load_both_ways, randomized

C = 8


def inputs():
    return (torch.rand(2, 4, 5, 5, 5, dtype=torch.float64),)


def fused(model: nn.Module, *, trace: bool = True) -> cutlassfuse.FuseResult:
    """fuse() of `model` in float64 with random parameters, after checking that the
    result holds the very parameters and computes the original's outputs."""
    model = randomized(model.double(), seed=0)
    x = inputs()
    expected = model(*x)
    parameters = {id(p) for p in model.parameters()}
    result = cutlassfuse.fuse(model, trace=trace)
    assert {id(p) for p in result.model.parameters()} == parameters, "parameters must be reused, not copied"
    torch.testing.assert_close(result.model(*x), expected, rtol=1e-10, atol=1e-10)
    return result


def blocks(model: nn.Module) -> list[str]:
    return [type(m).__name__ for m in model.modules()
            if isinstance(m, (Conv3dNormActivation, ConvTranspose3dNormActivation, ConvTranspose3dReLUGroupNorm,
                              GroupNormActivation))]


Id = nn.Identity
# Sequential chains: the layers, what the slots hold after fuse(), activation_before_norm.
SEQUENTIAL_CHAINS = {
    "conv_group_norm_leaky_relu": (lambda: [nn.Conv3d(4, C, 3, padding=1), nn.GroupNorm(2, C), nn.LeakyReLU(0.2)],
                                   [Conv3dNormActivation, Id, Id], False),
    "conv_instance_norm_prelu": (lambda: [nn.Conv3d(4, C, 3, stride=2, padding=1, bias=False),
                                          nn.InstanceNorm3d(C, affine=True), nn.PReLU(C)],
                                 [Conv3dNormActivation, Id, Id], False),
    "conv_transpose_instance_norm_silu": (lambda: [nn.ConvTranspose3d(4, C, 2, stride=2), nn.InstanceNorm3d(C),
                                                   nn.SiLU()], [ConvTranspose3dNormActivation, Id, Id], False),
    "conv_relu_group_norm": (lambda: [nn.Conv3d(4, C, 3), nn.ReLU(), nn.GroupNorm(4, C)],
                             [Conv3dNormActivation, Id, Id], True),
    "conv_transpose_elu_group_norm": (lambda: [nn.ConvTranspose3d(4, C, 3, padding=1), nn.ELU(0.5),
                                               nn.GroupNorm(4, C)], [ConvTranspose3dNormActivation, Id, Id], True),
    "conv_group_norm_then_conv": (lambda: [nn.Conv3d(4, C, 1), nn.GroupNorm(2, C), nn.Conv3d(C, 2, 1)],
                                  [Conv3dNormActivation, Id, nn.Conv3d], False),
    "no_ops_between": (lambda: [nn.Conv3d(4, C, 3, padding=1), nn.Identity(), nn.Dropout(0.0), nn.GroupNorm(2, C),
                                nn.Dropout3d(p=0), nn.GELU(approximate="tanh")],
                       [Conv3dNormActivation, Id, nn.Dropout, Id, nn.Dropout3d, Id], False),
    "conv_transpose_relu_group_norm": (lambda: [nn.ConvTranspose3d(4, C, 2, stride=2), nn.ReLU(), nn.GroupNorm(2, C)],
                                       [ConvTranspose3dReLUGroupNorm, Id, Id], None),
}


@pytest.mark.parametrize("name", SEQUENTIAL_CHAINS)
def test_sequential_chain(name):
    """The first layer's slot takes the block, the norm's and the activation's become
    nn.Identity (the layers after them keep their indices), no-ops stay."""
    layers, slots, activation_before_norm = SEQUENTIAL_CHAINS[name]
    model = nn.Sequential(*layers())
    result = fused(model)
    assert result.left_alone == [] and result.not_traced is None
    assert len(result.replaced) == 1 and result.replaced[0].startswith("0: ")
    assert result.replaced[0].endswith(f"-> {slots[0].__name__}")
    assert [type(m) for m in model] == slots
    if activation_before_norm is not None:
        assert model[0].activation_before_norm is activation_before_norm
    assert_checkpoints_load_both_ways(lambda: nn.Sequential(*layers()).double(), inputs())


def test_conv_norm_without_activation_takes_identity():
    model = nn.Sequential(*SEQUENTIAL_CHAINS["conv_group_norm_then_conv"][0]())
    fused(model)
    assert activation_of_module(model[0].activation)[0] == "identity"


class ADN(nn.Sequential):
    """As MONAI's: norm (N), dropout (D) and activation (A) in the order `ordering` names,
    the dropout there with p=0 too."""

    def __init__(self, ordering: str, channels: int, dropout: float = 0.0):
        layers = {"N": nn.InstanceNorm3d(channels, affine=True), "D": nn.Dropout(dropout), "A": nn.PReLU()}
        super().__init__(OrderedDict((key, layers[key]) for key in ordering))


class Convolution(nn.Sequential):
    """As MONAI's: the conv, then an ADN, both children of one nn.Sequential."""

    def __init__(self, cin: int, cout: int, ordering: str = "NDA", dropout: float = 0.0, transposed: bool = False):
        conv = (nn.ConvTranspose3d(cin, cout, 3, stride=2, padding=1, output_padding=1) if transposed
                else nn.Conv3d(cin, cout, 3, padding=1))
        super().__init__(OrderedDict(conv=conv, adn=ADN(ordering, cout, dropout)))


def monai_like():
    return nn.Sequential(Convolution(4, C), Convolution(C, C, ordering="ADN"), Convolution(C, 4, transposed=True),
                         nn.Conv3d(4, 2, 1))


def test_chain_across_nested_sequentials():
    """The conv in one nn.Sequential, the norm and the activation in its child: the conv's
    slot takes the block, the norm's and the activation's become nn.Identity, the
    dropout (p=0) stays."""
    model = monai_like()
    result = fused(model)
    assert [line.split(":")[0] for line in result.replaced] == ["0.conv", "1.conv", "2.conv"]
    assert blocks(model) == ["Conv3dNormActivation", "Conv3dNormActivation", "ConvTranspose3dNormActivation"]
    assert not model[0].conv.activation_before_norm and model[1].conv.activation_before_norm
    for convolution in model[:3]:
        assert type(convolution.adn.N) is nn.Identity and type(convolution.adn.A) is nn.Identity
        assert type(convolution.adn.D) is nn.Dropout
    assert list(model[1].adn._modules) == ["A", "D", "N"]
    assert_checkpoints_load_both_ways(lambda: monai_like().double(), inputs())


def test_dropout_above_zero_stays_between_the_layers():
    """A dropout with p > 0 randomizes in training: no block spans it, and the report
    says where; the layers on either side still fuse where they can."""
    model = nn.Sequential(Convolution(4, C, dropout=0.2),  # conv -> norm | Dropout(0.2) | PReLU
                          nn.Conv3d(C, C, 1), nn.Dropout3d(0.3), nn.GroupNorm(2, C), nn.ReLU())
    result = fused(model)
    assert str(result).splitlines()[0] == "cutlassfuse.fuse: 2 chain(s) fused"
    assert result.left_alone == ["0.adn.D: Dropout(p=0.2) between norm and activation",
                                 "2: Dropout3d(p=0.3) between conv and norm"]
    assert "  left alone: 2: Dropout3d(p=0.3) between conv and norm" in str(result).splitlines()
    convolution = model[0]
    assert type(convolution.conv) is Conv3dNormActivation and type(convolution.conv.activation) is nn.Identity
    assert type(convolution.adn.N) is nn.Identity and type(convolution.adn.A) is nn.PReLU
    assert [type(m) for m in model[1:]] == [nn.Conv3d, nn.Dropout3d, GroupNormActivation, nn.Identity]
    model.train()
    x = inputs()[0]
    assert not torch.equal(model(x), model(x)), "the dropouts must still drop in training"


def hooked_conv():
    conv = nn.Conv3d(4, C, 1)
    conv.register_forward_hook(lambda module, args, output: None)
    return conv


# Chains left alone: the layers, the report's line, the blocks fused all the same.
LEFT_ALONE = {
    "unsupported_activation_after_norm": (lambda: [nn.Conv3d(4, C, 1), nn.GroupNorm(2, C), nn.ReLU6()],
                                          "2: activation ReLU6 not supported", ["Conv3dNormActivation"]),
    "unsupported_activation_before_norm": (lambda: [nn.Conv3d(4, C, 1), nn.ReLU6(), nn.GroupNorm(2, C)],
                                           "1: activation ReLU6 not supported", []),
    "padding_mode": (lambda: [nn.Conv3d(4, C, 3, padding=1, padding_mode="reflect"), nn.GroupNorm(2, C), nn.ReLU()],
                     "0: the conv's padding_mode must be 'zeros', got 'reflect'", ["GroupNormActivation"]),
    "forward_hooks": (lambda: [hooked_conv(), nn.GroupNorm(2, C), nn.ReLU()],
                      "0: Conv3d has hooks, which the rewritten model would not run", ["GroupNormActivation"]),
}


@pytest.mark.parametrize("name", LEFT_ALONE)
def test_left_alone_with_the_reason(name):
    layers, reason, fused_blocks = LEFT_ALONE[name]
    result = fused(nn.Sequential(*layers()))
    assert result.left_alone == [reason]
    assert blocks(result.model) == fused_blocks


def test_instance_norm_first_is_known_to_be_3d():
    """An InstanceNorm3d takes 5-D input by its type: a norm -> activation at a model's
    start fuses."""
    model = nn.Sequential(nn.InstanceNorm3d(4, affine=True), nn.LeakyReLU(0.1), nn.Conv3d(4, C, 1))
    result = fused(model)
    assert result.replaced == ["0: InstanceNorm3d(4) + LeakyReLU(0.1) -> GroupNormActivation"]


class BasicBlock(nn.Module):
    """As DynUNet's UnetBasicBlock: conv -> norm -> LeakyReLU twice in forward() code,
    one activation module for both."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv3d(cin, cout, 3, padding=1, bias=False)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1, bias=False)
        self.lrelu = nn.LeakyReLU(0.01, inplace=True)
        self.norm1 = nn.InstanceNorm3d(cout, affine=True)
        self.norm2 = nn.InstanceNorm3d(cout, affine=True)

    def forward(self, x):
        x = self.lrelu(self.norm1(self.conv1(x)))
        return self.lrelu(self.norm2(self.conv2(x)))


class ResBlock(BasicBlock):
    """As DynUNet's UnetResBlock: the second norm's output meets the residual (a conv ->
    norm of its own) before the activation."""

    def __init__(self, cin: int, cout: int):
        super().__init__(cin, cout)
        self.conv3 = nn.Conv3d(cin, cout, 1, bias=False)
        self.norm3 = nn.InstanceNorm3d(cout, affine=True)

    def forward(self, x):
        out = self.lrelu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        out += self.norm3(self.conv3(x))
        return self.lrelu(out)


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = ResBlock(4, C)
        self.up = BasicBlock(C, 4)

    def forward(self, x):
        return self.up(self.block(x))


def test_chains_in_forward_code():
    result = fused(Encoder())
    assert isinstance(result.model, torch.fx.GraphModule) and result.not_traced is None
    assert [line.split(":")[0] for line in result.replaced] == [
        "block.conv1_norm1_leaky_relu", "block.conv2_norm2", "block.conv3_norm3", "up.conv1_norm1_leaky_relu",
        "up.conv2_norm2_leaky_relu"]
    assert blocks(result.model) == ["Conv3dNormActivation"] * 5
    assert type(result.model.block.conv2_norm2.activation) is nn.Identity
    assert_checkpoints_load_both_ways(lambda: Encoder().double(), inputs())


FUNCTIONAL_ACTIVATIONS = {
    "F.relu": (lambda x, block: F.relu(x), "relu"),
    "F.relu_inplace": (lambda x, block: F.relu(x, inplace=True), "relu"),
    "torch.relu": (lambda x, block: torch.relu(x), "relu"),
    "Tensor.relu": (lambda x, block: x.relu(), "relu"),
    "F.leaky_relu": (lambda x, block: F.leaky_relu(x, 0.2), "leaky_relu"),
    "F.silu": (lambda x, block: F.silu(x), "silu"),
    "F.gelu_tanh": (lambda x, block: F.gelu(x, approximate="tanh"), "gelu_tanh"),
    "F.elu": (lambda x, block: F.elu(x, alpha=0.5), "elu"),
    "F.prelu": (lambda x, block: F.prelu(x, block.slope), "prelu"),
}


class FunctionalBlock(nn.Module):
    """conv -> F.group_norm with the block's own weight and bias -> `activation`, then
    conv -> `activation` -> F.instance_norm without weight."""

    def __init__(self, name: str):
        super().__init__()
        self.activation = FUNCTIONAL_ACTIVATIONS[name][0]
        self.conv1 = nn.Conv3d(4, C, 3, padding=1)
        self.gamma = nn.Parameter(torch.ones(C))
        self.beta = nn.Parameter(torch.zeros(C))
        self.slope = nn.Parameter(torch.full((C,), 0.25))  # F.prelu's; the others never read it
        self.conv2 = nn.Conv3d(C, C, 1)

    def forward(self, x):
        x = self.activation(F.group_norm(self.conv1(x), 4, self.gamma, self.beta, eps=1e-3), self)
        return F.instance_norm(self.activation(self.conv2(x), self))


@pytest.mark.parametrize("name", FUNCTIONAL_ACTIVATIONS)
def test_functional_norms_and_activations(name):
    activation = FUNCTIONAL_ACTIVATIONS[name][1]
    result = fused(FunctionalBlock(name))
    names = [line.split(":")[0] for line in result.replaced]
    assert len(names) == 2 and names[0].startswith("conv1_group_norm_") and names[1].startswith("conv2_")
    after, before = (result.model.get_submodule(name) for name in names)
    assert type(after) is type(before) is Conv3dNormActivation
    assert not after.activation_before_norm and before.activation_before_norm
    assert activation_of_module(after.activation)[0] == activation_of_module(before.activation)[0] == activation
    assert after.norm.weight is result.model.gamma and after.norm.eps == 1e-3
    assert before.norm.weight is None and type(before.norm) is nn.InstanceNorm3d
    assert_checkpoints_load_both_ways(lambda: FunctionalBlock(name).double(), inputs())


def test_functional_norms_the_block_cannot_take_are_reported():
    class RunningStatistics(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv3d(4, C, 1)
            self.conv2 = nn.Conv3d(C, C, 1)
            self.gamma = nn.Parameter(torch.ones(C))
            self.register_buffer("mean", torch.zeros(C))
            self.register_buffer("var", torch.ones(C))

        def forward(self, x):
            x = F.relu(F.instance_norm(self.conv1(x), self.mean, self.var, use_input_stats=False))
            return F.relu(F.group_norm(self.conv2(x), 2, self.gamma * 2))

    result = fused(RunningStatistics())
    assert result.replaced == []
    assert result.left_alone == ["forward(): instance_norm: F.instance_norm with running statistics",
                                 "forward(): group_norm: F.group_norm's weight is not a parameter of the model"]


class PreActivationBlock(nn.Module):
    """As SegResNet's ResBlock: norm -> activation -> conv twice, plus the input."""

    def __init__(self):
        super().__init__()
        self.norm1 = nn.GroupNorm(2, C)
        self.norm2 = nn.GroupNorm(2, C)
        self.act = nn.ReLU(inplace=True)
        self.conv1 = nn.Conv3d(C, C, 3, padding=1)
        self.conv2 = nn.Conv3d(C, C, 3, padding=1)

    def forward(self, x):
        identity = x
        x = self.conv1(self.act(self.norm1(x)))
        x = self.conv2(self.act(self.norm2(x)))
        x += identity
        return x


class PreActivationNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv3d(4, C, 3, padding=1)
        self.blocks = nn.Sequential(PreActivationBlock(), PreActivationBlock())
        self.head = nn.Sequential(nn.GroupNorm(2, C), nn.SiLU(), nn.Conv3d(C, 2, 1))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def test_norm_activation_with_no_conv_in_front():
    """The first norm reads the block's input, which the residual reads too: a norm ->
    activation of its own. The head's norm -> activation is an nn.Sequential's, fused
    before the trace."""
    result = fused(PreActivationNet())
    assert result.left_alone == []
    assert [line.split(":")[0] for line in result.replaced] == [
        "head.0", "blocks.0.norm1_relu", "blocks.0.conv1_norm2_relu", "blocks.1.norm1_relu",
        "blocks.1.conv1_norm2_relu"]
    assert blocks(result.model) == ["GroupNormActivation", "Conv3dNormActivation"] * 2 + ["GroupNormActivation"]
    assert_checkpoints_load_both_ways(lambda: PreActivationNet().double(), inputs())


def test_norm_activation_on_the_model_input():
    """A GroupNorm takes (N, C, *) input of any spatial rank, and so does the fused norm:
    on the model's own input, whose rank the trace cannot tell, it fuses too."""
    block = randomized(PreActivationBlock().double(), seed=0)
    x = torch.rand(2, C, 4, 4, 4, dtype=torch.float64)
    expected = block(x)
    result = cutlassfuse.fuse(block)
    torch.testing.assert_close(result.model(x), expected, rtol=1e-10, atol=1e-10)
    assert [line.split(":")[0] for line in result.replaced] == ["norm1_relu", "conv1_norm2_relu"]
    assert result.left_alone == []


@pytest.mark.parametrize("shape", [(2, 4), (2, 4, 7), (2, 4, 5, 6), (2, 4, 3, 5, 6), (2, 4, 2, 3, 2, 3)],
                         ids=["0d", "1d", "2d", "3d", "4d"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["contiguous", "channels_last"])
def test_group_norm_activation_of_any_spatial_rank(shape, channels_last):
    """A GroupNorm -> SiLU in a 2-D network (as diffusers' 2-D autoencoders and UNets run
    it) fuses, and the block computes it on (N, C, *) input in either layout."""
    model = randomized(nn.Sequential(nn.GroupNorm(2, 4), nn.SiLU()).double(), seed=1)
    x = torch.rand(*shape, dtype=torch.float64)
    if channels_last and len(shape) in (4, 5):
        x = x.contiguous(memory_format=torch.channels_last if len(shape) == 4 else torch.channels_last_3d)
    expected = model(x)
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert blocks(result.model) == ["GroupNormActivation"], str(result)
    out = result.model(x)
    assert out.shape == expected.shape and out.stride() == expected.stride()
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_functional_instance_norm_of_unknown_rank_is_left_alone():
    """F.instance_norm normalizes every (N, C) over the spatial positions of any rank; the
    fused norm takes InstanceNorm3d's 5-D input only, which the trace cannot tell here."""

    class InstanceNormFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))

        def forward(self, x):
            return F.relu(F.instance_norm(x, weight=self.weight, bias=self.bias))

    result = cutlassfuse.fuse(InstanceNormFirst())
    assert result.replaced == []
    assert result.left_alone == ["forward(): instance_norm: InstanceNorm3d(4) -> ReLU: its input is not known to be "
                                 "5-D (N, C, D, H, W)"]


def test_channels_last_model_of_one_channel_input_returns_the_original_layout():
    """A one-channel input is contiguous in both layouts: PyTorch reads NCDHW strides as
    NCDHW, and so the original model returns NCDHW outputs, as the fused model must; its
    first convolution's weight takes channels-last strides, so that it writes channels-last."""
    model = randomized(nn.Sequential(nn.Conv3d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU()).double(), seed=0)
    result = cutlassfuse.fuse(model, channels_last=True)
    assert suggest_memory_format(result.model[0].conv.weight) == torch.channels_last_3d
    x = torch.rand(1, 1, 6, 6, 6, dtype=torch.float64)
    out = result.model(x)
    assert out.is_contiguous()
    torch.testing.assert_close(out, model(x))
    x_channels_last = torch.empty_like(x, memory_format=torch.channels_last_3d).copy_(x)
    assert result.model(x_channels_last).is_contiguous(memory_format=torch.channels_last_3d)


class CachedFrames(nn.Module):
    """A video decoder's shape: its output and the frames it hands the next call."""

    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Conv3d(8, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU())
        self.cache_layouts = []

    def forward(self, x, conv_cache=None):
        if conv_cache is not None:
            self.cache_layouts.append(conv_cache["frames"].is_contiguous(memory_format=torch.channels_last_3d))
            x = torch.cat([conv_cache["frames"], x], dim=2)
        out = self.block(x)
        return out, {"frames": out[:, :, -2:].clone()}


def test_channels_last_untraced_model_takes_its_state_back_channels_last():
    """The untraced channels-last model returns its frame caches NCDHW for NCDHW input, as
    the original; handed back, they enter channels-last, as its activations run."""
    model = randomized(CachedFrames().double(), seed=0)
    result = cutlassfuse.fuse(copy.deepcopy(model), trace=False, channels_last=True)
    assert result.channels_last and result.replaced
    x = torch.rand(1, 8, 3, 4, 4, dtype=torch.float64)
    cache, expected_cache = None, None
    for _ in range(2):
        (out, cache), (expected, expected_cache) = result.model(x, conv_cache=cache), model(x, expected_cache)
        assert out.is_contiguous() and cache["frames"].is_contiguous()
        torch.testing.assert_close(out, expected)
    assert result.model.cache_layouts == [True]


class ListCachedFrames(CachedFrames):
    """A video decoder that keeps its frame caches in a list its caller hands it, as
    diffusers' Wan decoder does."""

    def forward(self, x, feat_cache=None):
        out, cache = super().forward(x, None if feat_cache[0] is None else {"frames": feat_cache[0]})
        feat_cache[0] = cache["frames"]
        return out


def test_channels_last_untraced_model_writes_into_the_callers_list():
    model = randomized(ListCachedFrames().double(), seed=0)
    result = cutlassfuse.fuse(copy.deepcopy(model), trace=False, channels_last=True)
    x = torch.rand(1, 8, 3, 4, 4, dtype=torch.float64)
    cache, expected_cache = [None], [None]
    for _ in range(3):
        torch.testing.assert_close(result.model(x, feat_cache=cache), model(x, feat_cache=expected_cache))
        torch.testing.assert_close(cache[0], expected_cache[0])
    assert result.model.cache_layouts == [True, True]
