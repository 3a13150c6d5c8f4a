"""Copies of a module's parameters in the layout a kernel reads, kept while the
parameters are unchanged, so that a call does not convert them again."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

# Fused optimizers (Adam(fused=True), SGD(fused=True), ...) write the parameters without
# bumping their version counters, so every optimizer step invalidates the packed copies.
_optimizer_steps = 0


def _count_optimizer_step(optimizer, args, kwargs) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)


class PackedCopy:
    """``pack(source)``, kept until the source changes: written in place (its version
    counter, and any optimizer step), replaced, moved or cast (its address, dtype and
    strides).

    The entry holds the source's storage, so that no other tensor can take its address
    while the copy is kept: the CUDA caching allocator hands a freed block straight back
    to the next request of its size, so after ``.half().float()`` the new weight would
    otherwise sit where the old one was, with the same version. Writes that bypass both
    the version counter and the optimizer (through ``.data``, ``p.data.copy_(...)``, or a
    captured optimizer step replayed from a CUDA graph) need ``clear_packed_cache()`` on
    the module after them.
    """

    def __init__(self) -> None:
        self._entry: tuple | None = None

    def get(self, source: Tensor, pack: Callable[[Tensor], Tensor]) -> Tensor:
        key = (_optimizer_steps, source.data_ptr(), source._version, source.dtype, source.device, source.shape,
               source.stride())
        if self._entry is None or self._entry[0] != key:
            self._entry = (key, source.untyped_storage(), pack(source))
        return self._entry[2]


class PackedParameters(nn.Module):
    """A module that passes its kernels parameter copies in their layout (PackedCopy),
    one per name; ``.to()``, ``.cuda()``, ``.half()``, ... drop them."""

    def _packed_copy(self, name: str, tensor: Tensor, pack: Callable[[Tensor], Tensor]) -> Tensor | None:
        """``pack(tensor)``, kept while ``tensor`` is unchanged. None where no copy may be
        kept: on the CPU, while torch.fx traces the module (the parameter is a Proxy), while
        compiling (the conversion is part of the traced graph), during a CUDA graph capture
        (the graph would read a copy that a later call may replace) and under autocast to
        another dtype (the op casts the parameter itself)."""
        if (isinstance(tensor, torch.fx.Proxy) or not tensor.is_cuda or torch.compiler.is_compiling()
                or torch.cuda.is_current_stream_capturing()):
            return None
        if torch.is_autocast_enabled("cuda") and tensor.dtype != torch.get_autocast_dtype("cuda"):
            return None
        # A parameter viewing part of a larger buffer (FSDP's gathered parameters) can be
        # rewritten there without a version bump: packed on every call, never kept.
        if tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            return pack(tensor)
        copies = self.__dict__.setdefault("_packed", {})
        copy = copies.get(name)
        if copy is None:
            copy = copies[name] = PackedCopy()
        return copy.get(tensor, pack)

    def clear_packed_cache(self) -> None:
        """Drops the packed copies: needed only after writes to the parameters that
        neither a version counter nor an optimizer step shows (see ``PackedCopy``)."""
        self.__dict__.pop("_packed", None)

    def _apply(self, fn, recurse=True):
        # .to(), .cuda(), .half(), ...: the copies are stale, and would hold GPU memory
        # after .cpu().
        self.clear_packed_cache()
        return super()._apply(fn, recurse)
