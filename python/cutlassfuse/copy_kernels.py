"""ATen's replicate pad and nearest upsampling of CUDA tensors on cutlassfuse's copy
kernels, in code that fuse() cannot trace.

fuse() replaces the replicate pads of the code it traces with
``torch.ops.cutlassfuse.replication_pad3d``. A module whose own forward() torch.fx cannot
trace (diffusers' HunyuanVideo upsampling blocks branch on the number of frames) keeps its
code; fuse() wraps it in ``WithCopyKernels``, which runs it under ``CopyKernelMode``: a
dispatch mode that sends ATen's replication_pad3d and upsample_nearest3d of CUDA tensors to
cutlassfuse's ops. It sits below autograd: the values are ATen's, bit for bit, the
derivatives ATen's. Every other op passes through, at a few microseconds of host time
each. Under torch.compile the module runs without the mode, as compiled code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .replication_pad import REPLICATION_PAD3D
from .upsample_nearest import UPSAMPLE_NEAREST3D

_aten = torch.ops.aten


class CopyKernelMode(TorchDispatchMode):
    """ATen's replication_pad3d and upsample_nearest3d of plain CUDA tensors run as
    cutlassfuse's ops; everything else as it is. (F.interpolate's upsample_nearest3d.vec
    reaches a dispatch mode as upsample_nearest3d: it is a composite of it.)"""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Plain CUDA tensors only: a subclass (DTensor, a fake tensor) keeps its own dispatch.
        if args and type(args[0]) is torch.Tensor and args[0].is_cuda and not kwargs:
            if func is _aten.replication_pad3d.default:
                return REPLICATION_PAD3D(*args)
            if func is _aten.upsample_nearest3d.default:
                return UPSAMPLE_NEAREST3D(*args)
        return func(*args, **kwargs)


class WithCopyKernels(nn.Module):
    """`module` called under CopyKernelMode (as it is while torch.compile traces it)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return self.module(*args, **kwargs)
        with CopyKernelMode():
            return self.module(*args, **kwargs)
