"""Helpers to check cutlassfuse against PyTorch: a float64 reference and error metrics."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .info import info

# Accepted error of the op against float64, per dtype: relative error is
# ||out - ref|| / ||ref||. Half precision rounds the conv output and the result
# (2^-11); bfloat16 has 8 bits of mantissa (2^-8).
RELATIVE_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def fused_path_expected() -> bool:
    """Whether calls the fused path takes run it here: a Hopper GPU (sm_90) and a build
    with the CUDA kernels. Elsewhere they run the CUDA fallback."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and info()["cuda_kernels"]


def _float64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def reference_float64(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                      output_padding=0, groups: int = 1, dilation=1, *, num_groups: int,
                      norm_weight: Tensor | None = None, norm_bias: Tensor | None = None,
                      eps: float = 1e-5) -> Tensor:
    """GroupNorm(ReLU(ConvTranspose3d)) with PyTorch's ops in float64 on the inputs' device."""
    y = F.conv_transpose3d(_float64(input), _float64(weight), _float64(bias), stride, padding, output_padding,
                           groups, dilation)
    # torch.group_norm, not F.group_norm: the functional refuses groups of one element
    # ("more than 1 value per channel when training"), which the op normalizes to beta.
    return torch.group_norm(F.relu(y), num_groups, _float64(norm_weight), _float64(norm_bias), eps)


def poison_cuda_allocator(nbytes: int) -> None:
    """Leaves NaN in the CUDA caching allocator's free memory, so that an element an op
    allocates but fails to write reads back as NaN rather than as stale plausible data.

    The allocator serves requests above 1 MiB from its large pool and smaller ones from
    2 MiB segments of its small pool: cached free blocks are released first, then one
    free NaN block of at least `nbytes` is left in the large pool and one whole NaN
    segment in the small pool, which the next allocations split."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    small_block = 1 << 20  # the largest request the small pool serves
    large = torch.full((max(nbytes, 2 * small_block) // 2 + 1,), float("nan"), dtype=torch.float16, device="cuda")
    small = [torch.full((small_block // 2,), float("nan"), dtype=torch.float16, device="cuda") for _ in range(2)]
    del large, small


@dataclass(frozen=True)
class Errors:
    relative: float  # ||out - ref||_2 / ||ref||_2
    max_abs: float

    def __str__(self) -> str:
        return f"rel {self.relative:.2e}, max abs {self.max_abs:.2e}"


def errors(actual: Tensor, expected: Tensor) -> Errors:
    """Errors of `actual` against `expected`, computed in float64. NaN anywhere gives NaN."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return Errors(relative=(diff.norm() / expected.to(torch.float64).norm()).item(),
                  max_abs=diff.abs().max().item())


class KernelBenchModel(torch.nn.Module):
    """KernelBench level2/61's original ``Model``: the three PyTorch modules in a row."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, groups: int, bias: bool = False):
        super().__init__()
        self.conv_transpose = torch.nn.ConvTranspose3d(in_channels, out_channels, kernel_size, bias=bias)
        self.relu = torch.nn.ReLU()
        self.group_norm = torch.nn.GroupNorm(num_groups=groups, num_channels=out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.group_norm(self.relu(self.conv_transpose(x)))
