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
Every other op passes through, at several microseconds of host time each: in code of many
small ops that costs more than the replaced kernels save (diffusers' Wan and CogVideoX
decoders ran slower under it). So the module's first call that reaches CUDA decides: the
mode stays on where the estimated GPU time its replacements saved exceeds its host time
for every op it dispatched, and is off for later calls otherwise. Under torch.compile the
module runs without the mode, as compiled code.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from .bias_add import BIAS_ADD, BIAS_ADD_TYPES
from .replication_pad import REPLICATION_PAD3D
from .upsample_nearest import UPSAMPLE_NEAREST3D

_aten = torch.ops.aten

# The cost model of the first call's decision (H200, docs/performance.md): host time a
# dispatch mode adds per op, and the GPU time ATen's kernel takes longer than cutlassfuse's
# per MB of output (NCDHW, the smaller gain of the two layouts).
HOST_US_PER_OP = 8.0
SAVED_US_PER_MB = {"replication_pad3d": 3.5, "upsample_nearest3d": 5.0, "bias_add": 0.45}


def _plain_cuda(t) -> bool:
    # A subclass (DTensor, a fake tensor) keeps its own dispatch; a module's parameters
    # reach the mode as nn.Parameter.
    return type(t) in (torch.Tensor, nn.Parameter) and t.is_cuda


def _packed(t: torch.Tensor) -> bool:
    """Whether the copy kernels take `t`: packed in NCDHW or channels-last order (other
    strides, a frame-major view, take ATen's kernels inside cutlassfuse's ops, and save
    nothing)."""
    return t.dim() == 5 and (t.is_contiguous() or t.is_contiguous(memory_format=torch.channels_last_3d))


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
    upsample_nearest3d: it is a composite of it.) Counts the ops it dispatched, those of
    CUDA tensors, and the GPU time its replacements are estimated to save."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.cuda_ops = 0
        self.saved_us = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        kwargs = kwargs or {}
        if args and _plain_cuda(args[0]):
            self.cuda_ops += 1
            out = self._replacement(func, args) if not kwargs else None
            if out is not None:
                return out
        return func(*args, **kwargs)

    def _replacement(self, func, args: tuple) -> torch.Tensor | None:
        if func is _aten.replication_pad3d.default and _packed(args[0]):
            return self._saving("replication_pad3d", REPLICATION_PAD3D(*args))
        if func is _aten.upsample_nearest3d.default and _packed(args[0]):
            return self._saving("upsample_nearest3d", UPSAMPLE_NEAREST3D(*args))
        if func is _aten.convolution.default:
            out = _convolution_then_bias_add(args)
            return None if out is None else self._saving("bias_add", out)
        return None

    def _saving(self, op: str, out: torch.Tensor) -> torch.Tensor:
        self.saved_us += SAVED_US_PER_MB[op] * out.numel() * out.element_size() / 2**20
        return out

    def pays(self) -> bool:
        """Whether the replacements' estimated saving exceeds the host time of every op
        the mode dispatched."""
        return self.saved_us > HOST_US_PER_OP * self.ops


class WithKernelMode(nn.Module):
    """`module` called under KernelMode while `active` is not False (and as it is while
    torch.compile traces it). `active` None: decided by the first call that reaches
    CUDA (KernelMode.pays), the numbers in `decision`."""

    def __init__(self, module: nn.Module, active: bool | None = None):
        super().__init__()
        self.module = module
        self.active = active
        self.decision = "undecided" if active is None else "given"

    def forward(self, *args, **kwargs):
        if self.active is False or torch.compiler.is_compiling():
            return self.module(*args, **kwargs)
        mode = KernelMode()
        with mode:
            out = self.module(*args, **kwargs)
        if self.active is None and mode.cuda_ops:
            self.active = mode.pays()
            self.decision = (f"{mode.ops} ops dispatched ({HOST_US_PER_OP * mode.ops:.0f} us of host time), "
                             f"{mode.saved_us:.0f} us of GPU time saved")
        return out

    def extra_repr(self) -> str:
        return f"active={self.active}, decision={self.decision!r}"
