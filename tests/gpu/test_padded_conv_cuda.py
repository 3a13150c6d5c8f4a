"""On the GPU: ChannelPaddedConv3d pads a 16-bit convolution's few input channels to 8
(asserted) and stays as close to the float64 convolution as nn.Conv3d's own call."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cutlassfuse import padded_conv
from cutlassfuse.padded_conv import ChannelPaddedConv3d

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("in_channels", "stride"), [(1, 2), (3, 1)])
def test_padded_to_8_channels_as_accurate_as_conv3d(dtype, channels_last, in_channels, stride, monkeypatch):
    torch.manual_seed(0)
    conv = nn.Conv3d(in_channels, 2, 3, stride=stride, padding=1).cuda().to(dtype)
    padded = ChannelPaddedConv3d.from_conv(conv)
    x = torch.randn(2, in_channels, 20, 24, 28, device="cuda", dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    widths = []
    pad = padded_conv._with_zero_channels
    monkeypatch.setattr(padded_conv, "_with_zero_channels",
                        lambda t, channels: widths.append(pad(t, channels).shape[1]) or pad(t, channels))
    with torch.no_grad():
        got, eager = padded(x), conv(x)
        reference = F.conv3d(x.double(), conv.weight.double(), conv.bias.double(), stride, 1)
    assert widths == [8, 8]
    assert got.shape == eager.shape and got.dtype == dtype
    error, eager_error = ((t.double() - reference).abs().max().item() for t in (got, eager))
    assert error <= 1.5 * eager_error + 1e-6, (error, eager_error)
