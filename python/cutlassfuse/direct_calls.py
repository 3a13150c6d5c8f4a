"""The block family's CUDA kernels called without the dispatcher.

A call through ``torch.ops`` converts each of the op's arguments (the block op has 19) to
the dispatcher's boxed values and back before its CUDA kernel runs; for the small layers
of a network such as MONAI's UNet, whose kernels take a few microseconds, that was about a
tenth of the host's time per forward. The block modules call the ops' CUDA kernels
themselves (``cutlassfuse._C``, with the ops' arguments) where the dispatcher would route
the call straight to those kernels and do nothing else on the way: plain CUDA tensors, no
autograd to record, no autocast, no functorch transform, no torch function or dispatch
mode, no forward-mode AD, no profiler and no tracing or compiling. Every other call takes
the op.
"""

from __future__ import annotations

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor, nn

try:
    from ._C import conv3d_norm_activation_cuda, group_norm_activation_cuda
except ImportError:  # a build without the CUDA kernels
    conv3d_norm_activation_cuda = group_norm_activation_cuda = None

_BLOCK_OP = torch.ops.cutlassfuse.conv3d_norm_activation.default
_NORM_OP = torch.ops.cutlassfuse.group_norm_activation.default

# Tensor types without a __torch_function__ or __torch_dispatch__ of their own.
_PLAIN_TENSOR_TYPES = (Tensor, nn.Parameter)

# Positions of the tensors in the ops' argument lists (their schemas).
BLOCK_TENSOR_POSITIONS = (0, 1, 2, 10, 11, 15, 17, 18)
NORM_TENSOR_POSITIONS = (0, 2, 3, 7)


def dispatcher_adds_nothing(arguments: tuple, tensor_positions: tuple[int, ...]) -> bool:
    """Whether the dispatcher would pass a call with ``arguments`` to its backend's kernel
    and do nothing else: no tracing or compiling; the tensors at ``tensor_positions``
    (None where absent) plain and dense, none requiring grad in grad mode; no forward-mode
    AD level (dual tensors carry tangents whatever the grad mode), autocast, functorch
    transform, torch function or dispatch mode, or profiler."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or forward_ad._current_level >= 0):
        return False
    grad_mode = torch.is_grad_enabled()
    for position in tensor_positions:
        tensor = arguments[position]
        if tensor is None:
            continue
        if type(tensor) not in _PLAIN_TENSOR_TYPES or tensor.layout is not torch.strided:
            return False
        if grad_mode and tensor.requires_grad:
            return False
    return not (torch._C._is_any_autocast_enabled() or torch._C._are_functorch_transforms_active()
                or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()
                or torch.autograd._profiler_enabled())


def _call(kernel, op, tensor_positions: tuple[int, ...], arguments: tuple) -> Tensor:
    if kernel is not None and dispatcher_adds_nothing(arguments, tensor_positions) and arguments[0].is_cuda:
        return kernel(*arguments)
    return op(*arguments)


def conv3d_norm_activation(arguments: tuple) -> Tensor:
    """``torch.ops.cutlassfuse.conv3d_norm_activation(*arguments)``, through its CUDA
    kernel directly where the dispatcher would do nothing else."""
    return _call(conv3d_norm_activation_cuda, _BLOCK_OP, BLOCK_TENSOR_POSITIONS, arguments)


def group_norm_activation(arguments: tuple) -> Tensor:
    """``torch.ops.cutlassfuse.group_norm_activation(*arguments)``, through its CUDA kernel
    directly where the dispatcher would do nothing else."""
    return _call(group_norm_activation_cuda, _NORM_OP, NORM_TENSOR_POSITIONS, arguments)
