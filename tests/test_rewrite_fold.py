"""cutlassfuse.fuse folding the norms with running statistics (BatchNorm3d,
InstanceNorm3d with track_running_stats) in eval mode into the convolution before them:
in nn.Sequentials and in forward() code, the activation after them kept, float64 outputs
equal to the original model's, checkpoints of the original loading into the folded model;
in training mode nothing folds, and the report says why."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse

from fuse_checks import assert_folded_checkpoints_load, randomized

C = 8


def inputs():
    return (torch.rand(2, 4, 6, 6, 6, dtype=torch.float64),)


def folded(model: nn.Module) -> cutlassfuse.FuseResult:
    """fuse() of `model` in float64 with random parameters and running statistics, in
    eval mode, after checking that the result computes the original's outputs and leaves
    the original convolutions' parameters as they were."""
    model = randomized(model.double(), seed=0)
    x = inputs()
    expected = model(*x)
    convs = {conv: conv.weight.clone() for conv in model.modules() if isinstance(conv, (nn.Conv3d, nn.ConvTranspose3d))}
    result = cutlassfuse.fuse(model)
    torch.testing.assert_close(result.model(*x), expected, rtol=1e-10, atol=1e-10)
    assert all(torch.equal(conv.weight, weight) for conv, weight in convs.items())
    return result


# Sequential chains: the layers, what the slots hold after fuse(), the report's line.
SEQUENTIAL_FOLDS = {
    "conv_batch_norm_leaky_relu": (
        lambda: [nn.Conv3d(4, C, 3, padding=1), nn.BatchNorm3d(C), nn.LeakyReLU(0.2)],
        [nn.Conv3d, nn.Identity, nn.LeakyReLU],
        "0: Conv3d(4->8, kernel=(3, 3, 3), stride=(1, 1, 1)) + BatchNorm3d(8) folded into Conv3d, LeakyReLU kept"),
    "conv_without_bias_batch_norm": (
        lambda: [nn.Conv3d(4, C, 3, stride=2, bias=False), nn.BatchNorm3d(C)], [nn.Conv3d, nn.Identity],
        "0: Conv3d(4->8, kernel=(3, 3, 3), stride=(2, 2, 2)) + BatchNorm3d(8) folded into Conv3d"),
    "grouped_conv_batch_norm_without_affine": (
        lambda: [nn.Conv3d(4, C, 3, padding=1, groups=4), nn.BatchNorm3d(C, affine=False), nn.GELU()],
        [nn.Conv3d, nn.Identity, nn.GELU],
        "0: Conv3d(4->8, kernel=(3, 3, 3), stride=(1, 1, 1)) + BatchNorm3d(8) folded into Conv3d, GELU kept"),
    "conv_transpose_batch_norm_relu": (
        lambda: [nn.ConvTranspose3d(4, C, 3, stride=2, padding=1, output_padding=1), nn.BatchNorm3d(C), nn.ReLU()],
        [nn.ConvTranspose3d, nn.Identity, nn.ReLU],
        "0: ConvTranspose3d(4->8, kernel=(3, 3, 3), stride=(2, 2, 2)) + BatchNorm3d(8) folded into ConvTranspose3d, "
        "ReLU kept"),
    "grouped_conv_transpose_batch_norm": (
        lambda: [nn.ConvTranspose3d(4, C, 2, stride=2, groups=2, bias=False), nn.BatchNorm3d(C), nn.SiLU()],
        [nn.ConvTranspose3d, nn.Identity, nn.SiLU],
        "0: ConvTranspose3d(4->8, kernel=(2, 2, 2), stride=(2, 2, 2)) + BatchNorm3d(8) folded into ConvTranspose3d, "
        "SiLU kept"),
    "instance_norm_with_running_statistics": (
        lambda: [nn.Conv3d(4, C, 1), nn.InstanceNorm3d(C, affine=True, track_running_stats=True), nn.PReLU(C)],
        [nn.Conv3d, nn.Identity, nn.PReLU],
        "0: Conv3d(4->8, kernel=(1, 1, 1), stride=(1, 1, 1)) + InstanceNorm3d(8) folded into Conv3d, PReLU kept"),
    "no_ops_between": (
        lambda: [nn.Conv3d(4, C, 3, padding=1, padding_mode="reflect"), nn.Identity(), nn.Dropout(0.0),
                 nn.BatchNorm3d(C), nn.ELU(0.5)],
        [nn.Conv3d, nn.Identity, nn.Dropout, nn.Identity, nn.ELU],
        "0: Conv3d(4->8, kernel=(3, 3, 3), stride=(1, 1, 1)) + BatchNorm3d(8) folded into Conv3d, ELU kept"),
}


@pytest.mark.parametrize("name", SEQUENTIAL_FOLDS)
def test_sequential_fold(name):
    """The conv's slot takes a new conv holding the folded weight and bias, the norm's
    becomes nn.Identity, the activation stays; nothing is fused."""
    layers, slots, line = SEQUENTIAL_FOLDS[name]
    model = nn.Sequential(*layers())
    conv = model[0]
    result = folded(model)
    assert result.folded == [line] and result.replaced == [] and result.left_alone == []
    assert [type(m) for m in model] == slots
    assert model[0] is not conv and model[0].bias is not None
    assert_folded_checkpoints_load(lambda: nn.Sequential(*layers()).double(), inputs())


def test_report_counts_fused_and_folded_apart():
    model = nn.Sequential(nn.Conv3d(4, C, 1), nn.BatchNorm3d(C), nn.ReLU(), nn.Conv3d(C, C, 1), nn.GroupNorm(2, C),
                          nn.SiLU())
    result = folded(model)
    lines = str(result).splitlines()
    assert lines[0] == "cutlassfuse.fuse: 1 chain(s) fused, 1 norm(s) folded into their convolution"
    assert lines[1].endswith("-> Conv3dNormActivation") and lines[2].endswith("folded into Conv3d, ReLU kept")


def batch_norm_layers():
    return [nn.Conv3d(4, C, 3, padding=1), nn.BatchNorm3d(C), nn.ReLU()]


def hooked_conv():
    conv = nn.Conv3d(4, C, 1)
    conv.register_forward_hook(lambda module, args, output: None)
    return conv


# Chains left alone in eval mode: the layers, the report's line.
LEFT_ALONE = {
    "batch_statistics": (lambda: [nn.Conv3d(4, C, 1), nn.BatchNorm3d(C, track_running_stats=False)],
                         "1: BatchNorm3d without running statistics (track_running_stats=False) uses batch statistics"),
    "forward_hooks": (lambda: [hooked_conv(), nn.BatchNorm3d(C)],
                      "0: Conv3d has hooks, which the rewritten model would not run"),
    "dropout_between": (lambda: [nn.Conv3d(4, C, 1), nn.Dropout3d(0.2), nn.BatchNorm3d(C)],
                        "1: Dropout3d(p=0.2) between conv and norm"),
}


@pytest.mark.parametrize("name", LEFT_ALONE)
def test_left_alone_with_the_reason(name):
    layers, reason = LEFT_ALONE[name]
    result = folded(nn.Sequential(*layers()))
    assert result.folded == [] and result.left_alone == [reason]


@pytest.mark.parametrize("norm, reason", [
    (nn.BatchNorm3d(C), "BatchNorm3d in training mode uses batch statistics"),
    (nn.InstanceNorm3d(C, track_running_stats=True),
     "InstanceNorm3d with running statistics (track_running_stats=True) in training mode normalizes by each sample's "
     "statistics and updates the running ones"),
])
def test_nothing_folds_in_training_mode(norm, reason):
    model = nn.Sequential(nn.Conv3d(4, C, 3, padding=1), norm, nn.ReLU()).train()
    result = cutlassfuse.fuse(model)
    assert result.folded == [] and result.replaced == []
    assert result.left_alone == [f"1: {reason}"]
    assert [type(m) for m in model] == [nn.Conv3d, type(norm), nn.ReLU]


class Transitions(nn.Module):
    """As VNet's transitions: conv -> BatchNorm3d -> activation in forward() code, the
    transposed one's output meeting the input."""

    def __init__(self):
        super().__init__()
        self.down_conv = nn.Conv3d(4, C, 2, stride=2, bias=False)
        self.bn1 = nn.BatchNorm3d(C)
        self.act = nn.ELU(inplace=True)
        self.up_conv = nn.ConvTranspose3d(C, 4, 2, stride=2)
        self.bn2 = nn.BatchNorm3d(4)

    def forward(self, x):
        down = self.act(self.bn1(self.down_conv(x)))
        return F.relu(self.bn2(self.up_conv(down)) + x)


def test_folds_in_forward_code():
    result = folded(Transitions())
    assert isinstance(result.model, torch.fx.GraphModule) and result.not_traced is None
    assert result.folded == [
        "down_conv_bn1: Conv3d(4->8, kernel=(2, 2, 2), stride=(2, 2, 2)) + BatchNorm3d(8) folded into Conv3d, ELU kept",
        "up_conv_bn2: ConvTranspose3d(8->4, kernel=(2, 2, 2), stride=(2, 2, 2)) + BatchNorm3d(4) folded into "
        "ConvTranspose3d"]
    assert not any(isinstance(m, nn.BatchNorm3d) for m in result.model.modules())
    assert_folded_checkpoints_load(lambda: Transitions().double(), inputs())


class SharedTransitions(nn.Module):
    """As DynUNet registers its blocks: the same module twice, and a head forward()
    never calls."""

    def __init__(self):
        super().__init__()
        self.down = Transitions()
        self.skip_layers = nn.ModuleDict({"down": self.down})
        self.unused_head = nn.Sequential(nn.Conv3d(4, 2, 1), nn.BatchNorm3d(2))

    def forward(self, x):
        return self.skip_layers["down"](x)


def test_folded_checkpoints_of_shared_and_uncalled_modules():
    """The folded convs' tensors replace the convs' and norms' under both paths; the head
    forward() never calls (folded in its nn.Sequential) keeps its folded conv."""
    model = assert_folded_checkpoints_load(lambda: SharedTransitions().double(), inputs())
    keys = list(model.state_dict())
    assert keys == ["down.down_conv_bn1.weight", "down.down_conv_bn1.bias", "down.up_conv_bn2.weight",
                    "down.up_conv_bn2.bias", "unused_head.0.weight", "unused_head.0.bias"]
