"""``torch.ops.cutlassfuse.upsampled_modulation``: ``act(input * up(scale) + up(shift))``,
``up`` PyTorch's nearest upsampling of the lower-resolution ``scale`` and ``shift`` to the
input's frames and pixels (``F.interpolate(t, size=...)``); with ``causal_frames``, frame 0
from frame 0 and the later frames from the later ones, upsampled apart.

A spatially conditioned norm (diffusers' CogVideoX decoder) modulates its normalized
activation by tensors computed at the latent's resolution. Written as PyTorch ops, both are
upsampled to the full size, multiplied and added, and the activation is a pass of its own.
The op's CUDA kernel reads the small tensors where they are (in L2) and writes the output
once, for channels-last tensors of 16-bit or float32 elements whose channels are a
multiple of 8 (cutlassfuse/common/upsampled_modulation.h); every other call runs ATen's
ops, with one rounding of the modulation (addcmul). A call that autograd records runs the
same kernel and records ATen's ops' derivatives.
"""

from __future__ import annotations

import torch
from torch import Tensor

UPSAMPLED_MODULATION = torch.ops.cutlassfuse.upsampled_modulation.default


@torch.library.register_fake("cutlassfuse::upsampled_modulation")
def _upsampled_modulation_fake(input: Tensor, scale: Tensor, shift: Tensor, causal_frames: bool = False,
                               activation: str = "identity", activation_parameter: float = 0.0) -> Tensor:
    torch._check(input.dim() == 5 and scale.dim() == 5 and scale.shape == shift.shape
                 and scale.shape[:2] == input.shape[:2],
                 lambda: "cutlassfuse.upsampled_modulation: a 5-D input, and scale and shift of one shape with its "
                         "batch and channels")
    torch._check(scale.dtype == input.dtype and shift.dtype == input.dtype,
                 lambda: "cutlassfuse.upsampled_modulation: scale and shift must have the input's type")
    return torch.empty_like(input, memory_format=torch.channels_last_3d
                            if input.is_contiguous(memory_format=torch.channels_last_3d) else torch.contiguous_format)
