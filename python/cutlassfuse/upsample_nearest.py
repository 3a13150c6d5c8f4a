"""F.interpolate(x, ..., mode="nearest") on 5-D input as
``torch.ops.cutlassfuse.upsample_nearest3d`` (aten::upsample_nearest3d's arguments).

Video autoencoders upsample every activation this way (diffusers' HunyuanVideo upsampling
blocks: the frames after the first, 2x in time and space), and ATen's CUDA kernel for it
runs at a tenth of memory bandwidth, on NCDHW tensors only. The op's CUDA kernel copies
each output element from its source (cutlassfuse/common/upsample_nearest.h): the same
values as ATen's, in the input's layout; every other call runs ATen's upsample_nearest3d. A
call that autograd records runs the same kernels and records ATen's derivative.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

UPSAMPLE_NEAREST3D = torch.ops.cutlassfuse.upsample_nearest3d.default
CAUSAL_UPSAMPLE_NEAREST3D = torch.ops.cutlassfuse.causal_upsample_nearest3d.default


@torch.library.register_fake("cutlassfuse::upsample_nearest3d")
def _upsample_nearest3d_fake(input: Tensor, output_size: list[int], scales_d: float | None = None,
                             scales_h: float | None = None, scales_w: float | None = None) -> Tensor:
    # ATen's upsampling on fake tensors (its shape and dtype), in the input's suggested layout.
    out = torch.ops.aten.upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w)
    return out.contiguous(memory_format=suggest_memory_format(input))



@torch.library.register_fake("cutlassfuse::causal_upsample_nearest3d")
def _causal_upsample_nearest3d_fake(input: Tensor, scale_factor: list[float]) -> Tensor:
    # The output's sizes as the op computes them, in the input's suggested layout.
    torch._check(input.dim() == 5 and len(scale_factor) == 3 and min(scale_factor) > 0,
                 lambda: "cutlassfuse.causal_upsample_nearest3d: a 5-D input and three positive factors")
    frames, height, width = input.shape[2:]
    size = [1 + math.floor((frames - 1) * scale_factor[0]) if frames > 1 else frames,
            math.floor(height * scale_factor[1]), math.floor(width * scale_factor[2])]
    return input.new_empty([*input.shape[:2], *size]).contiguous(memory_format=suggest_memory_format(input))
