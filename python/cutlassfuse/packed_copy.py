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


def _views_part_of_buffer(tensor: Tensor) -> bool:
    """Whether `tensor` views part of a larger buffer (FSDP's gathered parameters), which
    can be rewritten there without a version bump."""
    return tensor.storage_offset() != 0 or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size()


class PackedCopy:
    """``pack(source)``, kept until the source changes: written in place (its version
    counter, and any optimizer step), replaced, moved or cast (its address, dtype and
    strides). A source viewing part of a larger buffer is packed on every call, never
    kept.

    The entry holds the source's storage, so that no other tensor can take its address
    while the copy is kept: the CUDA caching allocator hands a freed block straight back
    to the next request of its size, so after ``.half().float()`` the new weight would
    otherwise sit where the old one was, with the same version. For the same reason a
    source matching the key is in the storage that was checked when the copy was made,
    so a call that finds its copy checks nothing more (the host's time per call counts on
    small layers). CUDA gives every device's allocations distinct addresses, so the
    address also tells the device. Writes that bypass both the version counter and the
    optimizer (through ``.data``, ``p.data.copy_(...)``, or a captured optimizer step
    replayed from a CUDA graph) need ``clear_packed_cache()`` on the module after them.
    """

    __slots__ = ("_key", "_storage", "_copy")

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._storage = self._copy = None

    @property
    def kept(self) -> Tensor | None:
        """The copy kept, if any."""
        return self._copy

    def get(self, source: Tensor, pack: Callable[[Tensor], Tensor]) -> Tensor:
        key = (_optimizer_steps, source._version, source.data_ptr(), source.dtype, source.shape, source.stride())
        if key == self._key:
            return self._copy
        if _views_part_of_buffer(source):
            self._key = self._storage = self._copy = None
            return pack(source)
        self._key, self._storage, self._copy = key, source.untyped_storage(), pack(source)
        return self._copy


class PackedParameters(nn.Module):
    """A module that passes its kernels parameter copies in their layout (PackedCopy),
    one per name; ``.to()``, ``.cuda()``, ``.half()``, ... drop them."""

    def _packed_copy(self, name: str, tensor: Tensor, pack: Callable[[Tensor], Tensor]) -> Tensor | None:
        """``pack(tensor)``, kept while ``tensor`` is unchanged; None where no copy may be
        kept (``_may_keep_copies``)."""
        return self._kept_copy(name, tensor, pack) if self._may_keep_copies(tensor) else None

    def _may_keep_copies(self, tensor: Tensor) -> bool:
        """Whether a call on ``tensor`` may take kept copies. Not on the CPU, while torch.fx
        traces the module (the parameter is a Proxy), while compiling (the conversion is
        part of the traced graph), during a CUDA graph capture (the graph would read a copy
        that a later call may replace) or under autocast to another dtype (the op casts the
        parameter itself)."""
        if (isinstance(tensor, torch.fx.Proxy) or not tensor.is_cuda or torch.compiler.is_compiling()
                or torch._C._cuda_isCurrentStreamCapturing()):
            return False
        return not (torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled("cuda")
                    and tensor.dtype != torch.get_autocast_dtype("cuda"))

    def _kept_copy(self, name: str, tensor: Tensor, pack: Callable[[Tensor], Tensor]) -> Tensor:
        """``pack(tensor)``, kept while ``tensor`` is unchanged, for a call that
        ``_may_keep_copies`` allowed."""
        copies = self.__dict__.get("_packed")
        if copies is None:
            copies = self.__dict__["_packed"] = {}
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
