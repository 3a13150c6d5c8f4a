"""``torch.ops.cutlassfuse.channel_rms_norm``: an RMS norm over the channels (dimension 1)
of each pixel, a per-channel affine and an activation,
``act(x * r * weight[c] + bias[c])`` with ``r = 1 / sqrt(mean_c(x^2) + eps)``, or with
``clamp`` ``r = 1 / max(sqrt(mean_c(x^2)), eps)``.

Video autoencoders normalize this way (diffusers' Wan decoder: ``F.normalize(x, dim=1) *
sqrt(C) * gamma``, which is ``clamp`` with ``eps = 1e-12 / sqrt(C)``; LTX-Video's RMSNorm
over moved channels). Written as PyTorch ops it is about eight full-size passes in float32
and the input's type; the op's CUDA kernel reads the input once and writes once,
computing in float32 and rounding once (cutlassfuse/norm/channel_rms_norm.h), for dense
16-bit or float32 input of any layout (channels-last: channels a multiple of 8 up to 1024);
every other call runs ATen's ops. A call that autograd records runs the same kernel and records ATen's ops'
derivatives.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHANNEL_RMS_NORM = torch.ops.cutlassfuse.channel_rms_norm.default


@torch.library.register_fake("cutlassfuse::channel_rms_norm")
def _channel_rms_norm_fake(input: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
                           eps: float = 1e-6, clamp: bool = False, activation: str = "identity",
                           activation_parameter: float = 0.0) -> Tensor:
    torch._check(input.dim() >= 2, lambda: "cutlassfuse.channel_rms_norm: input must be (N, C, ...)")
    for name, t in (("weight", weight), ("bias", bias)):
        torch._check(t is None or (t.dim() == 1 and t.shape[0] == input.shape[1]),
                     lambda name=name: f"cutlassfuse.channel_rms_norm: {name} must have shape (C,)")
    return torch.empty_like(input)
