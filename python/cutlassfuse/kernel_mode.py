"""ATen's memory-bound ops of CUDA tensors on cutlassfuse's kernels, in code that fuse()
cannot trace.

In the code it traces, fuse() replaces replicate pads with
``torch.ops.cutlassfuse.replication_pad3d`` and splits a convolution's bias into
``torch.ops.cutlassfuse.bias_add``. A module whose own forward() torch.fx cannot trace
(diffusers' HunyuanVideo upsampling blocks branch on the number of frames) keeps its code;
fuse() wraps it in ``WithKernelMode``, which runs it under ``KernelMode``: a dispatch mode
that sends ATen's replication_pad3d and upsample_nearest3d to cutlassfuse's copy kernels
and adds a 3-D convolution's bias with cutlassfuse's bias_add after ATen's convolution
without it. It sits below autograd: the values are ATen's, bit for bit (where ATen's
convolution runs cuDNN's, after which it adds the bias itself), the derivatives ATen's.
Every other op passes through, at a few microseconds of host time each. Under
torch.compile the module runs without the mode, as compiled code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .bias_add import BIAS_ADD, BIAS_ADD_TYPES
from .replication_pad import REPLICATION_PAD3D
from .upsample_nearest import UPSAMPLE_NEAREST3D

_aten = torch.ops.aten


def _plain_cuda(t) -> bool:
    # A subclass (DTensor, a fake tensor) keeps its own dispatch; a module's parameters
    # reach the mode as nn.Parameter.
    return type(t) in (torch.Tensor, nn.Parameter) and t.is_cuda


def _convolution_then_bias_add(args: tuple) -> torch.Tensor | None:
    """aten.convolution(input, weight, bias, ...) of a 5-D input as the convolution without
    its bias, then bias_add: the values of ATen's convolution, which adds the bias after
    cuDNN's convolution in a broadcasting pass of its own (the same rounding, at about
    half the speed). None where the call is not such."""
    input, weight, bias = args[:3]
    if bias is None or not (_plain_cuda(input) and _plain_cuda(weight) and _plain_cuda(bias)):
        return None
    if input.dim() != 5 or input.dtype not in BIAS_ADD_TYPES or bias.dtype != input.dtype:
        return None
    return BIAS_ADD(_aten.convolution.default(input, weight, None, *args[3:]), bias)


class KernelMode(TorchDispatchMode):
    """ATen's replication_pad3d and upsample_nearest3d of plain CUDA tensors run as
    cutlassfuse's ops, a 3-D convolution's bias add as bias_add; everything else as it
    is. (F.interpolate's upsample_nearest3d.vec reaches a dispatch mode as
    upsample_nearest3d: it is a composite of it.)"""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and _plain_cuda(args[0]) and not kwargs:
            if func is _aten.replication_pad3d.default:
                return REPLICATION_PAD3D(*args)
            if func is _aten.upsample_nearest3d.default:
                return UPSAMPLE_NEAREST3D(*args)
            if func is _aten.convolution.default:
                out = _convolution_then_bias_add(args)
                if out is not None:
                    return out
        return func(*args, **kwargs)


class WithKernelMode(nn.Module):
    """`module` called under KernelMode (as it is while torch.compile traces it)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self.module(*args, **kwargs)
        with KernelMode():
            return self.module(*args, **kwargs)
