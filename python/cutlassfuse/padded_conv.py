"""nn.Conv3d whose float16/bfloat16 CUDA calls with fewer than 8 input and output
channels run on tensor cores.

cuDNN ran MONAI UNet's last layer, a Conv3d(2, 2, 3) on 2x2x96^3 inside the
channels-last network that fuse() makes, with a generic kernel that does not use tensor
cores (implicit_convolveNd_sgemm, about 0.4 ms of the network's 1.55 ms of kernels on an
H100). Zero channels appended to the input and the weight, up to 8, make it a
tensor-core convolution with the same sums: every product the padding adds is an exact
zero. Layers with 8 or more output channels are left as they are: padding SegResNet's
Conv3d(1, 16, 3) made it slightly slower, and so it did every 1- and 4-channel layer of
16 output channels timed alone (docs/performance.md). The block family's fallback pads
its convolutions' input channels the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_CHANNEL_MULTIPLE = 8  # cuDNN's tensor-core kernels take 16-bit channels in multiples of 8


def _with_zero_channels(t: Tensor, channels: int) -> Tensor:
    """`t` ([N, C, D, H, W]) with zero channels after its C, up to `channels`, channels-last."""
    padded = F.pad(t, (0, 0, 0, 0, 0, 0, 0, channels - t.shape[1]))
    return padded.contiguous(memory_format=torch.channels_last_3d)


class ChannelPaddedConv3d(nn.Conv3d):
    """An nn.Conv3d (same parameters, state_dict keys and results) that pads fewer than 8
    input channels with zero channels in float16/bfloat16 on CUDA (module docstring);
    fuse() gives it to layers of fewer than 8 output channels too."""

    @classmethod
    def takes(cls, conv: nn.Module) -> bool:
        """Whether `conv` is a plain nn.Conv3d with fewer than 8 input and output channels,
        one group and zero padding."""
        return (type(conv) is nn.Conv3d and conv.in_channels < _CHANNEL_MULTIPLE
                and conv.out_channels < _CHANNEL_MULTIPLE and conv.groups == 1 and conv.padding_mode == "zeros")

    @classmethod
    def from_conv(cls, conv: nn.Conv3d) -> ChannelPaddedConv3d:
        """The same convolution, holding `conv`'s parameter objects."""
        padded = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                     bias=conv.bias is not None, device="meta")
        padded.weight, padded.bias = conv.weight, conv.bias
        padded.train(conv.training)
        return padded

    def forward(self, x: Tensor) -> Tensor:
        if not (x.is_cuda and x.dim() == 5 and x.shape[1] == self.in_channels
                and x.dtype in (torch.float16, torch.bfloat16) and self.weight.dtype == x.dtype):
            return super().forward(x)
        return F.conv3d(_with_zero_channels(x, _CHANNEL_MULTIPLE), _with_zero_channels(self.weight, _CHANNEL_MULTIPLE),
                        self.bias, self.stride, self.padding, self.dilation)
