"""F.pad(x, pad, mode="replicate") with six pads as ``torch.ops.cutlassfuse.replication_pad3d``.

Video autoencoders pad every causal convolution's input this way (diffusers'
HunyuanVideoCausalConv3d: one frame-wise replicate pad of (1, 1, 1, 1, 2, 0) before a
Conv3d without padding), and ATen's CUDA kernel for it runs far below memory bandwidth,
computing a 64-bit index per element. The op's CUDA kernel pads a packed tensor at the speed
of a copy in both layouts, several times ATen's (cutlassfuse/common/replication_pad.h), its
output in the input's layout; every other call runs ATen's replication_pad3d. A call that
autograd records runs the same kernels and records ATen's derivative, so that a forward in
grad mode keeps the speed. fuse() puts the op in place of the replicate pads it finds in traced code.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

REPLICATION_PAD3D = torch.ops.cutlassfuse.replication_pad3d.default


@torch.library.register_fake("cutlassfuse::replication_pad3d")
def _replication_pad3d_fake(input: Tensor, padding: list[int]) -> Tensor:
    # ATen's pad on fake tensors (its shape and dtype), in the input's suggested layout.
    out = torch.ops.aten.replication_pad3d(input, padding)
    return out.contiguous(memory_format=suggest_memory_format(input))
