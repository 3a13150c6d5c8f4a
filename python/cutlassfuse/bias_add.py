"""A convolution's bias, and a residual added after it, as ``torch.ops.cutlassfuse.bias_add``:
``input + bias.view(1, C, 1, ...) (+ residual)``.

ATen adds a convolution's bias after cuDNN's convolution in a pass of its own, in a
broadcasting kernel at about half of memory bandwidth, and a residual add after it is a
second pass over the output. The op's CUDA kernel adds both in one pass at memory
bandwidth (cutlassfuse/common/bias_add.h), the sum in float32 rounded once, the output
with the input's strides; every other call runs ATen's adds. A call that autograd records
runs the same kernel and records the adds' derivatives. fuse() calls a traced convolution
through ``conv3d_bias_add``: on CUDA without its bias and this op after it (rewrite.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .traceable_forwards import opaque_to_tracing

BIAS_ADD = torch.ops.cutlassfuse.bias_add.default
BIAS_ADD_TYPES = (torch.float16, torch.bfloat16, torch.float32)  # the kernel's element types


@torch.library.register_fake("cutlassfuse::bias_add")
def _bias_add_fake(input: Tensor, bias: Tensor, residual: Tensor | None = None) -> Tensor:
    # ATen's adds on fake tensors: their shape, type and layout, and their errors.
    torch._check(input.dim() >= 2 and bias.dim() == 1 and bias.shape[0] == input.shape[1],
                 lambda: "cutlassfuse.bias_add: bias must hold one value per channel of the input")
    out = input + bias.reshape([1, -1] + [1] * (input.dim() - 2))
    return out if residual is None else out + residual


@opaque_to_tracing  # its branch asks a real tensor's device and type
def conv3d_bias_add(input: Tensor, weight: Tensor, bias: Tensor, stride: tuple, padding: tuple, dilation: tuple,
                    groups: int, residual: Tensor | None = None) -> Tensor:
    """F.conv3d(input, weight, bias, ...) (+ residual). On CUDA, in the types of bias_add's
    kernel, the convolution runs without its bias and bias_add adds the bias and the
    residual in one pass: the value of ATen's convolution where it runs cuDNN's (which adds
    the bias after it), the residual then rounded once. Elsewhere (the CPU's convolutions
    add the bias as they compute) ATen's calls, as the model wrote them."""
    if input.is_cuda and input.dtype in BIAS_ADD_TYPES:
        return BIAS_ADD(F.conv3d(input, weight, None, stride, padding, dilation, groups), bias, residual)
    out = F.conv3d(input, weight, bias, stride, padding, dilation, groups)
    return out if residual is None else out + residual
