"""The ops' kernels called without the dispatcher.

A call through ``torch.ops`` converts each of the op's arguments (the block op has 19) to
the dispatcher's boxed values and back before its kernels run; for the small layers of a
network such as MONAI's UNet, whose kernels take a few microseconds, that was about a
tenth of the host's time per forward. The modules call the ops' kernels themselves
(``cutlassfuse._C``, with the ops' arguments) where the dispatcher would route the call
straight to them and do nothing else on the way: plain CUDA tensors, no autocast, no
functorch transform, no torch function or dispatch mode, no forward-mode AD, no profiler
and no tracing or compiling. Such a call takes the op's Autograd kernel when grad mode is
on and a tensor requires grad (it records the call for the backward, as the dispatcher's
Autograd key would), its CUDA kernel otherwise. Every other call takes the op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor, nn

from . import _C


class _Kernels(NamedTuple):
    """An op and, in a CUDA build, its CUDA and Autograd kernels as functions."""
    op: Callable
    cuda: Callable | None
    autograd: Callable | None


def _kernels(name: str) -> _Kernels:
    return _Kernels(getattr(torch.ops.cutlassfuse, name).default, getattr(_C, f"{name}_cuda", None),
                    getattr(_C, f"{name}_autograd", None))


_OP = _kernels("conv_transpose3d_relu_group_norm")
_BLOCK = _kernels("conv3d_norm_activation")
_NORM = _kernels("group_norm_activation")

# Tensor types without a __torch_function__ or __torch_dispatch__ of their own.
_PLAIN_TENSOR_TYPES = (Tensor, nn.Parameter)

# Positions of the tensors in the ops' argument lists (their schemas).
OP_TENSOR_POSITIONS = (0, 1, 2, 3, 4, 12, 13)
BLOCK_TENSOR_POSITIONS = (0, 1, 2, 10, 11, 15, 17, 18)
NORM_TENSOR_POSITIONS = (0, 2, 3, 7)


def dispatcher_route(arguments: tuple, tensor_positions: tuple[int, ...]) -> str:
    """Where the dispatcher would send a call with ``arguments``: "kernel" when straight
    to its backend's kernel, "autograd" when to its Autograd kernel (grad mode on and a
    tensor requiring grad) and from there to the backend's, "op" when it has anything
    else to do on the way: tracing or compiling; a tensor at ``tensor_positions`` (None
    where absent) not plain or not dense; a forward-mode AD level (dual tensors carry
    tangents whatever the grad mode), autocast, a functorch transform, a torch function
    or dispatch mode, or the profiler."""
    if (torch.compiler.is_compiling() or torch._C._get_tracing_state() is not None
            or forward_ad._current_level >= 0):
        return "op"
    records = False
    grad_mode = torch.is_grad_enabled()
    for position in tensor_positions:
        tensor = arguments[position]
        if tensor is None:
            continue
        if type(tensor) not in _PLAIN_TENSOR_TYPES or tensor.layout is not torch.strided:
            return "op"
        records = records or (grad_mode and tensor.requires_grad)
    if (torch._C._is_any_autocast_enabled() or torch._C._are_functorch_transforms_active()
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack()
            or torch.autograd._profiler_enabled()):
        return "op"
    return "autograd" if records else "kernel"


def _call(kernels: _Kernels, tensor_positions: tuple[int, ...], arguments: tuple) -> Tensor:
    # The route first: it takes the op for anything but plain tensors (an FX Proxy too).
    route = dispatcher_route(arguments, tensor_positions)
    if route != "op" and kernels.cuda is not None and arguments[0].is_cuda:
        return (kernels.cuda if route == "kernel" else kernels.autograd)(*arguments)
    return kernels.op(*arguments)


def conv_transpose3d_relu_group_norm(arguments: tuple) -> Tensor:
    """``torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*arguments)``, through its
    kernels directly where the dispatcher would do nothing else."""
    return _call(_OP, OP_TENSOR_POSITIONS, arguments)


def conv3d_norm_activation(arguments: tuple) -> Tensor:
    """``torch.ops.cutlassfuse.conv3d_norm_activation(*arguments)``, through its kernels
    directly where the dispatcher would do nothing else."""
    return _call(_BLOCK, BLOCK_TENSOR_POSITIONS, arguments)


def group_norm_activation(arguments: tuple) -> Tensor:
    """``torch.ops.cutlassfuse.group_norm_activation(*arguments)``, through its kernels
    directly where the dispatcher would do nothing else."""
    return _call(_NORM, NORM_TENSOR_POSITIONS, arguments)
