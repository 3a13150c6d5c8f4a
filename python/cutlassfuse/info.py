"""What this installation of cutlassfuse was built with and can run here."""

from __future__ import annotations

from typing import Any

import torch

from . import _build_info


def _device_summary() -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return {
        "name": torch.cuda.get_device_name(index),
        "capability": f"{major}.{minor}",
        "fused_kernels_apply": (major, minor) == (9, 0) and _build_info.WITH_CUDA,
    }


def info() -> dict[str, Any]:
    """Package version, the torch/CUDA/CUTLASS it was built against, the CUDA
    architectures of the project's own kernels (the CUTLASS tensor-core kernels are
    sm_90a), the float32 mode (``set_float32_mode``), and the current GPU (None without
    one)."""
    return {
        "version": _build_info.VERSION,
        "torch_built_against": _build_info.TORCH_VERSION,
        "torch_cuda_built_against": _build_info.TORCH_CUDA_VERSION or None,
        "torch_runtime": torch.__version__,
        "cuda_kernels": _build_info.WITH_CUDA,
        "cuda_toolkit": _build_info.CUDA_VERSION or None,
        "cuda_architectures": list(_build_info.CUDA_ARCHITECTURES),
        "tensor_core_kernels": "sm_90a" if _build_info.WITH_CUDA else None,
        "cutlass_version": _build_info.CUTLASS_VERSION or None,
        "float32_mode": torch.ops.cutlassfuse.float32_mode(),
        "device": _device_summary(),
    }
