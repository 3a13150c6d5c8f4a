"""cutlassfuse: GroupNorm(ReLU(ConvTranspose3d(x))) as one PyTorch op.

On Hopper GPUs (sm_90) in float16/bfloat16 the op runs a CUTLASS implicit-GEMM
deconvolution on tensor cores with bias, ReLU and GroupNorm statistics fused into its
epilogue, then cutlassfuse's normalize kernel; other CUDA calls take a fallback
(cuDNN's convolution, then cutlassfuse's ReLU/GroupNorm kernels), the CPU PyTorch's
own kernels. ``cutlassfuse.explain(...)`` says which path a call takes;
``cutlassfuse.backends`` holds the switches for benchmarking the kernels.
"""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from ._loader import load_extension

load_extension()

from ._build_info import VERSION as __version__  # noqa: E402
from . import backends  # noqa: E402
from .block_modules import (  # noqa: E402
    Conv3dNormActivation,
    ConvTranspose3dNormActivation,
    FrameGroupNormActivation,
    GroupNormActivation,
)
from .blocks import (  # noqa: E402
    conv3d_norm_activation,
    conv_transpose3d_norm_activation,
    explain_block,
    group_norm_activation,
)
from .cuda_graphs import CUDAGraphed  # noqa: E402
from .info import info  # noqa: E402
from .modules import ConvTranspose3dReLUGroupNorm  # noqa: E402
from .ops import (  # noqa: E402
    conv_transpose3d_relu_group_norm,
    explain,
    float32_mode,
    get_float32_mode,
    set_float32_mode,
    set_float32_tensor_cores,
)
from .rewrite import FuseResult, fuse  # noqa: E402

__all__ = [
    "Conv3dNormActivation",
    "ConvTranspose3dNormActivation",
    "ConvTranspose3dReLUGroupNorm",
    "CUDAGraphed",
    "FuseResult",
    "backends",
    "conv3d_norm_activation",
    "conv_transpose3d_norm_activation",
    "conv_transpose3d_relu_group_norm",
    "explain",
    "explain_block",
    "float32_mode",
    "FrameGroupNormActivation",
    "get_float32_mode",
    "GroupNormActivation",
    "group_norm_activation",
    "fuse",
    "info",
    "set_float32_mode",
    "set_float32_tensor_cores",
    "__version__",
]
