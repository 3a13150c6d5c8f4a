"""nn.Conv3d for float16/bfloat16 CUDA layers of fewer than 8 input and output channels
(a network's last layer, such as MONAI UNet's Conv3d(2, 2, 3)).

cuDNN runs these layers with generic kernels far from memory bandwidth, in either dtype;
with the input and weight padded to 8 zero channels it runs a tensor-core convolution with
the same sums (every product the padding adds is an exact zero), faster in float16, much
less so in bfloat16. So inference calls run this project's direct convolution
(``torch.ops.cutlassfuse.direct_conv3d``: a thread per four output pixels along W, the
filter in shared memory), and calls that autograd records run the padded convolution,
whose backward is cuDNN's on tensor cores. Layers with 8 or more output channels are left
as they are: padding made SegResNet's Conv3d(1, 16, 3) slightly slower, and every 1- and
4-channel layer of 16 output channels timed alone (docs/performance.md has the times).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_CHANNEL_MULTIPLE = 8  # cuDNN's tensor-core kernels take 16-bit channels in multiples of 8
_DIRECT_CONV = torch.ops.cutlassfuse.direct_conv3d.default


def _with_zero_channels(t: Tensor, channels: int) -> Tensor:
    """`t` ([N, C, D, H, W]) with zero channels after its C, up to `channels`, channels-last."""
    padded = F.pad(t, (0, 0, 0, 0, 0, 0, 0, channels - t.shape[1]))
    return padded.contiguous(memory_format=torch.channels_last_3d)


class FewChannelConv3d(nn.Conv3d):
    """An nn.Conv3d (same parameters, state_dict keys and results) whose float16/bfloat16
    CUDA calls run the direct convolution, or, where autograd records the call, the
    convolution with its input and weight padded to 8 zero channels (module docstring).
    fuse() gives it to layers of fewer than 8 input and output channels."""

    @classmethod
    def takes(cls, conv: nn.Module) -> bool:
        """Whether `conv` is a plain nn.Conv3d with fewer than 8 input and output channels,
        one group and zero padding."""
        return (type(conv) is nn.Conv3d and conv.in_channels < _CHANNEL_MULTIPLE
                and conv.out_channels < _CHANNEL_MULTIPLE and conv.groups == 1 and conv.padding_mode == "zeros")

    @classmethod
    def from_conv(cls, conv: nn.Conv3d) -> FewChannelConv3d:
        """The same convolution, holding `conv`'s parameter objects."""
        layer = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding, conv.dilation,
                    bias=conv.bias is not None, device="meta")
        layer.weight, layer.bias = conv.weight, conv.bias
        layer.train(conv.training)
        return layer

    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.weight, self.bias
        if not (isinstance(x, Tensor) and x.is_cuda and x.dim() == 5 and x.shape[1] == self.in_channels
                and x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype
                and isinstance(self.padding, tuple)):
            return super().forward(x)
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                        or (bias is not None and bias.requires_grad)):
            return F.conv3d(_with_zero_channels(x, _CHANNEL_MULTIPLE), _with_zero_channels(weight, _CHANNEL_MULTIPLE),
                            bias, self.stride, self.padding, self.dilation)
        return _DIRECT_CONV(x, weight, bias, self.stride, self.padding, self.dilation)


@torch.library.register_fake("cutlassfuse::direct_conv3d")
def _direct_conv3d_fake(input: Tensor, weight: Tensor, bias: Tensor | None, stride: list[int], padding: list[int],
                        dilation: list[int]) -> Tensor:
    # ATen's convolution on fake tensors: its shape, dtype and layout are the op's.
    return F.conv3d(input, weight, bias, stride, padding, dilation)
