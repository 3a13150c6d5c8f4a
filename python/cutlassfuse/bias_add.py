"""A convolution's bias, and a residual added after it, as ``torch.ops.cutlassfuse.bias_add``:
``input + bias.view(1, C, 1, ...) (+ residual)``.

ATen adds a convolution's bias after cuDNN's convolution in a pass of its own, in a
broadcasting kernel at about half of memory bandwidth, and a residual add after it is a
second pass over the output. The op's CUDA kernel adds both in one pass at memory
bandwidth (cutlassfuse/common/bias_add.h), the sum in float32 rounded once, the output
with the input's strides; every other call, and every call that autograd records, runs
ATen's adds. fuse() calls a traced convolution without its bias and this op after it
(rewrite.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

BIAS_ADD = torch.ops.cutlassfuse.bias_add.default


@torch.library.register_fake("cutlassfuse::bias_add")
def _bias_add_fake(input: Tensor, bias: Tensor, residual: Tensor | None = None) -> Tensor:
    # ATen's adds on fake tensors: their shape, type and layout, and their errors.
    torch._check(input.dim() >= 2 and bias.dim() == 1 and bias.shape[0] == input.shape[1],
                 lambda: "cutlassfuse.bias_add: bias must hold one value per channel of the input")
    out = input + bias.reshape([1, -1] + [1] * (input.dim() - 2))
    return out if residual is None else out + residual
