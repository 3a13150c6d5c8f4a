"""On the GPU: a model that cutlassfuse.fuse rewrites into the block family's modules (a
MONAI-style nested nn.Sequential, a pre-activation residual block in forward() code, a
decoder step) gives the original's outputs, no further from float64 than eager's, in
NCDHW and channels-last, and trains to the same loss."""

import copy
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.testing import errors

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

FLOOR = {torch.bfloat16: 6e-2, torch.float32: 2e-5}


class PreActivation(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(4, channels)
        self.norm2 = nn.GroupNorm(4, channels)
        self.conv1 = nn.Conv3d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv3d(channels, channels, 3, padding=1)

    def forward(self, x):
        y = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(y)))


def family_model() -> nn.Module:
    adn = nn.Sequential(OrderedDict(N=nn.InstanceNorm3d(32, affine=True), D=nn.Dropout(0.0), A=nn.LeakyReLU(0.1)))
    return nn.Sequential(nn.Sequential(OrderedDict(conv=nn.Conv3d(16, 32, 3, padding=1), adn=adn)),
                         PreActivation(32),
                         nn.ConvTranspose3d(32, 16, 2, stride=2), nn.GroupNorm(4, 16), nn.ReLU(),
                         nn.Conv3d(16, 2, 1))


def fused_copy(model: nn.Module) -> nn.Module:
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert len(result.replaced) == 4 and result.left_alone == [], str(result)
    return result.model


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bfloat16", "float32"])
def test_fused_model_against_float64(dtype, channels_last):
    torch.manual_seed(0)
    eager = family_model().cuda().eval()
    x = torch.randn(2, 16, 8, 9, 10, device="cuda")
    with torch.no_grad():
        expected = copy.deepcopy(eager).double()(x.double())
        fused = fused_copy(eager).to(dtype)
        eager = eager.to(dtype)
        x = x.to(dtype)
        if channels_last:
            layout = torch.channels_last_3d
            fused, eager, x = fused.to(memory_format=layout), eager.to(memory_format=layout), x.to(memory_format=layout)
        ours, theirs = errors(fused(x), expected), errors(eager(x), expected)
    assert ours.relative <= max(2 * theirs.relative, FLOOR[dtype]), f"fused {ours}, eager {theirs}"


def test_fused_model_trains_to_the_same_loss():
    torch.manual_seed(0)
    eager = family_model().cuda()
    fused = fused_copy(eager)
    x = torch.randn(2, 16, 8, 8, 8, device="cuda")
    target = torch.randn(2, 2, 16, 16, 16, device="cuda")
    losses = {}
    for name, model in (("eager", eager), ("fused", fused)):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(10):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), target)
            loss.backward()
            optimizer.step()
        losses[name] = loss.item()
    assert losses["fused"] == pytest.approx(losses["eager"], rel=1e-3)
