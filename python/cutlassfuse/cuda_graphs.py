"""A module's inference forward replayed from CUDA graphs.

Small layers and networks of them are bound by the host: issuing a call's kernels (Python,
the dispatcher, validation, allocations, launches) takes longer than the GPU takes to run
them, so the GPU idles between kernels. A CUDA graph records the kernels of one forward
once and replays them with a single launch. ``CUDAGraphed(module)`` does that per input
signature, for the calls where a replay computes what the module's own forward would:

- replayed: every argument a CUDA tensor, grad mode off (``torch.no_grad()``,
  ``torch.inference_mode()``) or nothing requiring grad, the module in eval mode, autocast
  off, outside torch.compile and outside another capture;
- every other call runs ``module(...)`` itself.

A graph is captured on a signature's first call (two warm-up forwards on a side stream,
then the capture) and kept for its input shapes, strides, dtypes and device, inference
mode, and the settings a forward reads (cutlassfuse's backend flags and float32 mode, cuDNN's and
cuBLAS's switches); at most ``max_graphs`` are kept, the least recently used dropped. A
replay copies the arguments into the graph's input tensors and returns copies of its
outputs, which the next replay overwrites. The parameters and buffers are read where
they lie: a graph is captured again after any of them changes in place (its version
counter) or moves, and after a parameter, buffer or submodule of the module is assigned.
Tensors that forward() reads from plain attributes are read where they were at capture.
"""

from __future__ import annotations

import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from . import backends
from .ops import get_float32_mode

_WARM_UP_CALLS = 2

# Modules whose parameters, buffers or children were assigned since a graph of theirs was
# captured: set by torch.nn's global registration hooks, read (and cleared) per call.
_watched: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_assigned: weakref.WeakSet[nn.Module] = weakref.WeakSet()
_hooks_installed = False


def _note_assignment(module: nn.Module, name: str, value: Any) -> None:
    if module in _watched:
        _assigned.add(module)


def _install_assignment_hooks() -> None:
    global _hooks_installed
    if not _hooks_installed:
        nn.modules.module.register_module_parameter_registration_hook(_note_assignment)
        nn.modules.module.register_module_buffer_registration_hook(_note_assignment)
        nn.modules.module.register_module_module_registration_hook(_note_assignment)
        _hooks_installed = True


def _settings() -> tuple:
    """What else decides which kernels a forward runs."""
    return (tuple(backends.get_flags().values()), get_float32_mode(), torch.backends.cudnn.enabled,
            torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled())


def _signature(args: tuple[torch.Tensor, ...]) -> tuple:
    # Inference mode makes the graph's input tensors inference tensors, which no later call
    # outside it may copy into.
    return (tuple((a.shape, a.stride(), a.dtype, a.device) for a in args), torch.is_inference_mode_enabled(),
            *_settings())


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: tuple[torch.Tensor, ...]
    outputs: Any
    tensors: list[torch.Tensor]  # every parameter and buffer of the module
    state: list[tuple[int, int]]  # their (version, data_ptr) at capture

    def current(self) -> bool:
        """Whether every parameter and buffer is as it was at capture."""
        return self.state == _state(self.tensors)


def _state(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    return [(t._version, t.data_ptr()) for t in tensors]


class CUDAGraphed(nn.Module):
    """``module``'s forward, replayed from CUDA graphs where a replay computes what the
    forward would (module docstring). The state_dict is ``module``'s, under the same keys."""

    def __init__(self, module: nn.Module, *, max_graphs: int = 4) -> None:
        super().__init__()
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"CUDAGraphed: max_graphs must be a positive int, got {max_graphs!r}")
        self.module = module
        self.max_graphs = max_graphs
        self.train(module.training)
        self._graphs: OrderedDict[tuple, _Graph | None] = OrderedDict()  # None: the capture failed
        self._members: set[nn.Module] = set()  # the module's submodules when the graphs were captured
        self._register_state_dict_hook(_strip_prefix)
        self._register_load_state_dict_pre_hook(_add_prefix)
        _install_assignment_hooks()

    @property
    def captured_graphs(self) -> int:
        """How many graphs are kept now."""
        return sum(entry is not None for entry in self._graphs.values())

    def extra_repr(self) -> str:
        return f"max_graphs={self.max_graphs}"

    def __getstate__(self) -> dict:
        # copy.deepcopy and pickle take the module without its graphs (which neither can
        # copy): the copy captures its own.
        state = self.__dict__.copy()
        state["_graphs"], state["_members"] = OrderedDict(), set()
        return state

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or not self._replayable(args):
            return self.module(*args, **kwargs)
        key = _signature(args)
        entry = self._current_graph(key, args)
        if entry is None:
            return self.module(*args)
        for static, value in zip(entry.inputs, args, strict=True):
            static.copy_(value)
        entry.graph.replay()
        return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, entry.outputs)

    def _replayable(self, args: tuple) -> bool:
        if self.module.training or not args or not all(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            return False
        if torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing():
            return False
        if torch.is_autocast_enabled("cuda"):
            return False
        if torch.is_grad_enabled():
            return not any(a.requires_grad for a in args) and not any(p.requires_grad for p in self.parameters())
        return True

    def _current_graph(self, key: tuple, args: tuple[torch.Tensor, ...]) -> _Graph | None:
        if _assigned and not _assigned.isdisjoint(self._members):
            self._drop_graphs()
        if key in self._graphs:
            entry = self._graphs[key]
            if entry is None:
                return None
            if entry.current():
                self._graphs.move_to_end(key)
                return entry
            del self._graphs[key]
        entry = self._capture(args)
        self._graphs[key] = entry
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return entry

    def _drop_graphs(self) -> None:
        self._graphs.clear()
        for module in self._members:
            _assigned.discard(module)
        self._members = set()

    def _capture(self, args: tuple[torch.Tensor, ...]) -> _Graph | None:
        inputs = tuple(a.clone() for a in args)  # clone keeps each argument's strides
        device = args[0].device
        with torch.cuda.device(device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # lazy initialization, cuDNN's autotuning, cached operands
                for _ in range(_WARM_UP_CALLS):
                    self.module(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    outputs = self.module(*inputs)
            except RuntimeError as error:  # an op that synchronizes or is not capturable
                warnings.warn(f"CUDAGraphed: the forward could not be captured in a CUDA graph, so calls of "
                              f"this signature run it directly: {str(error).splitlines()[0]}", stacklevel=4)
                return None
        for module in self.module.modules():
            _watched.add(module)
            self._members.add(module)
        tensors = [*self.module.parameters(), *self.module.buffers()]
        return _Graph(graph, inputs, outputs, tensors, _state(tensors))


def _strip_prefix(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> dict:
    inner = prefix + "module."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    return state_dict


def _add_prefix(state_dict: dict, prefix: str, local_metadata: Any, strict: bool, missing_keys: list,
                unexpected_keys: list, error_msgs: list) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "module.")]:
        state_dict[prefix + "module." + key[len(prefix):]] = state_dict.pop(key)


__all__ = ["CUDAGraphed"]
