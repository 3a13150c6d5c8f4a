"""`cutlassfuse.fuse(model)`: replace the layer chains of an existing model that one of
cutlassfuse's blocks computes by that block, keeping the very same parameters.

A chain is a Conv3d or ConvTranspose3d, then a GroupNorm or InstanceNorm3d with an
activation after it, before it, or none (Conv3dNormActivation, ConvTranspose3dNormActivation;
ConvTranspose3d -> ReLU -> GroupNorm stays ConvTranspose3dReLUGroupNorm), or a norm and
its activation with no convolution in front (GroupNormActivation). nn.Identity and dropout
with p=0 between the layers are passed through. In eval mode a norm that normalizes by
running statistics (BatchNorm3d, InstanceNorm3d with track_running_stats) folds into the
Conv3d or ConvTranspose3d before it instead: a per-channel scale and shift there. In
traced code, replicate pads of 5-D tensors (F.pad with mode="replicate" and six pads,
nn.ReplicationPad3d: a video autoencoder's causal convolutions) become
torch.ops.cutlassfuse.replication_pad3d, several times faster than ATen's pad on CUDA, and
a Conv3d's bias, with a residual added to its output, torch.ops.cutlassfuse.bias_add; a
module whose own code no trace reaches runs its replicate pads, nearest upsampling and
convolution bias adds on cutlassfuse's kernels (kernel_mode.py)."""

from __future__ import annotations

import copy
import functools
import operator
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn
from torch._prims_common import suggest_memory_format
from torch.nn.utils.fusion import fuse_conv_bn_weights

from .block_modules import (
    Conv3dNormActivation,
    ConvTranspose3dNormActivation,
    FrameGroupNormActivation,
    GroupNormActivation,
    _activation_module,
    _ConvNormActivation,
    _norm_module,
)
from .blocks import activation_of_module
from .cuda_graphs import CUDAGraphed
from .modules import ConvTranspose3dReLUGroupNorm
from .few_channel_conv import FewChannelConv3d
from .bias_add import conv3d_bias_add
from .kernel_mode import WithKernelMode
from .library_modules import replace_library_modules
from .replication_pad import REPLICATION_PAD3D
from .traceable_forwards import opaque_to_tracing, stand_in

_CONVS = (nn.Conv3d, nn.ConvTranspose3d)
_NORMS = (nn.GroupNorm, nn.InstanceNorm3d)
# The layer kinds by their name in the report's reasons.
_KIND_TEXT = {"running_norm": "norm"}
_DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
_FUSED = (ConvTranspose3dReLUGroupNorm, _ConvNormActivation, GroupNormActivation, FrameGroupNormActivation)
# Layers whose output is 5-D (N, C, D, H, W), given the batched input that 3-D layers take.
_THREE_D = (*_CONVS, *_FUSED, nn.BatchNorm3d, nn.InstanceNorm3d, nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveMaxPool3d,
            nn.AdaptiveAvgPool3d)
# Calls whose output is 5-D where every tensor they read is (broadcasting adds no dimension then).
_ELEMENTWISE = {operator.add, operator.iadd, operator.sub, operator.isub, operator.mul, operator.imul, torch.add,
                torch.sub, torch.mul, torch.cat}
_ELEMENTWISE_METHODS = {"add", "add_", "sub", "sub_", "mul", "mul_"}
# Calls whose output has as many dimensions as their input.
_SAME_RANK_FUNCTIONS = {F.interpolate, F.dropout, F.dropout3d}

# The functional activations: the op's activation, and the arguments after the input with
# their defaults (PReLU's weight: the model's parameter that the call reads).
_ACTIVATION_FUNCTIONS = {
    F.relu: ("relu", {"inplace": False}),
    torch.relu: ("relu", {}),
    torch.relu_: ("relu", {}),
    F.leaky_relu: ("leaky_relu", {"negative_slope": 0.01, "inplace": False}),
    F.leaky_relu_: ("leaky_relu", {"negative_slope": 0.01}),
    F.silu: ("silu", {"inplace": False}),
    F.gelu: ("gelu", {"approximate": "none"}),
    F.elu: ("elu", {"alpha": 1.0, "inplace": False}),
    F.elu_: ("elu", {"alpha": 1.0}),
    F.prelu: ("prelu", {"weight": None}),
}
_ACTIVATION_METHODS = ("relu", "relu_")
# The functional norms: the arguments after the input with their defaults.
_NORM_FUNCTIONS = {
    F.group_norm: {"num_groups": None, "weight": None, "bias": None, "eps": 1e-5},
    F.instance_norm: {"running_mean": None, "running_var": None, "weight": None, "bias": None,
                      "use_input_stats": True, "momentum": 0.1, "eps": 1e-5},
}


@dataclass
class FuseResult:
    model: nn.Module
    replaced: list[str] = field(default_factory=list)  # one line per fused chain: where, what, what it became
    not_traced: str | None = None  # why the torch.fx pass could not run, if it could not
    left_alone: list[str] = field(default_factory=list)  # one line per chain not fused: where, and why
    folded: list[str] = field(default_factory=list)  # one line per norm folded into its conv: where, what
    channels_last: bool = False  # whether the model's activations run channels-last (fuse's channels_last)
    # one line per plain Conv3d of fewer than 8 input and output channels made a FewChannelConv3d
    few_channel_convs: list[str] = field(default_factory=list)
    # one line per add of a block's output that the block's op now computes: where, what
    residual_adds: list[str] = field(default_factory=list)
    # one line per replicate pad of traced code that runs cutlassfuse's pad, or that pads nothing
    # and only convolutions read, dropped: where, what
    replicate_pads: list[str] = field(default_factory=list)
    # one line per module whose own code no trace reached, run with cutlassfuse's kernels for
    # ATen's replicate pads, nearest upsampling and convolution bias adds (WithKernelMode): where, what
    kernel_mode: list[str] = field(default_factory=list)
    # one line per traced Conv3d whose bias, and the residual added to its output, cutlassfuse's
    # bias_add adds after the convolution: where, what
    bias_adds: list[str] = field(default_factory=list)
    # one line per library module replaced by cutlassfuse's module of its computation
    # (library_modules.py): where, what
    library_modules: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        head = f"cutlassfuse.fuse: {len(self.replaced)} chain(s) fused"
        if self.library_modules:
            head += f", {len(self.library_modules)} library module(s) replaced"
        if self.folded:
            head += f", {len(self.folded)} norm(s) folded into their convolution"
        changes = (self.library_modules + self.replaced + self.residual_adds + self.folded + self.few_channel_convs
                   + self.replicate_pads + self.bias_adds + self.kernel_mode)
        lines = [head] + [f"  {line}" for line in changes]
        lines += [f"  left alone: {line}" for line in self.left_alone]
        if self.not_traced:
            lines.append(f"  (forward() not traced: {self.not_traced})")
        if self.replaced:
            lines.append("  activations run channels-last" if self.channels_last else
                         "  activations keep the input's layout (channels_last=True puts them channels-last)")
        if isinstance(self.model, CUDAGraphed):
            lines.append("  inference calls replay CUDA graphs of the fused forward")
        return "\n".join(lines)


@dataclass(eq=False)
class _Layer:
    """One layer of a chain, as a fused block takes it."""

    # "conv", "norm", "running_norm" (a norm with running statistics), "activation", "noop" (nn.Identity,
    # dropout with p=0), "dropout" (p > 0)
    kind: str
    path: str  # where it is: the module's path, or the function call's in forward()
    name: str  # dotted, for a fused module's name: the module's path, or the calling module's and the call's
    module: nn.Module | None  # the module computing it; a function call's holds the very tensors it reads
    problem: str | None = None  # why it cannot join a fused block, where it cannot
    input: Any = None  # in a trace: the node it reads
    call: tuple[tuple, dict] | None = None  # in a trace: the arguments a fused block in its place takes
    function: bool = False  # a function call in a trace (F.group_norm, F.silu, ...), not a module


def _dropout_text(module: nn.Module) -> str:
    return f"{type(module).__name__}(p={module.p})"


def _running_statistics_problem(norm: nn.Module) -> str | None:
    """Why `norm` (BatchNorm3d, or InstanceNorm3d with track_running_stats) does not
    normalize by fixed running statistics now, which folding it takes; None where it does."""
    if isinstance(norm, nn.InstanceNorm3d):
        return ("InstanceNorm3d with running statistics (track_running_stats=True) in training mode normalizes by "
                "each sample's statistics and updates the running ones" if norm.training else None)
    if norm.training:
        return "BatchNorm3d in training mode uses batch statistics"
    if norm.running_mean is None:
        return "BatchNorm3d without running statistics (track_running_stats=False) uses batch statistics"
    return None


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _returns_input(module: nn.Module) -> bool:
    """nn.Identity and dropout with p=0: their output is their input, in either mode."""
    return isinstance(module, nn.Identity) or (isinstance(module, _DROPOUTS) and module.p == 0)


def _module_layer(module: nn.Module, path: str) -> _Layer | None:
    """What `module` (at `path`) is in a chain, or None for a layer that ends one."""
    hooked = _has_hooks(module)
    problem = f"{type(module).__name__} has hooks, which the rewritten model would not run" if hooked else None
    if _returns_input(module):
        return None if hooked else _Layer("noop", path, path, module)
    if isinstance(module, _DROPOUTS):
        return _Layer("dropout", path, path, module, _dropout_text(module))
    if type(module) in _CONVS:
        return _Layer("conv", path, path, module, problem)
    if type(module) is nn.BatchNorm3d or (type(module) is nn.InstanceNorm3d and module.track_running_stats):
        return _Layer("running_norm", path, path, module, problem or _running_statistics_problem(module))
    if type(module) in _NORMS:
        return _Layer("norm", path, path, module, problem)
    try:
        activation_of_module(module)
    except ValueError:
        if type(module).__module__ != nn.modules.activation.__name__:
            return None
        problem = f"activation {type(module).__name__} not supported"
    return _Layer("activation", path, path, module, problem)


def _five_d_after(module: nn.Module, layer: _Layer | None, input_five_d: bool) -> bool:
    """Whether `module`'s output is known to be 5-D (`layer`: what it is in a chain)."""
    if isinstance(module, _THREE_D):
        return True
    return input_five_d and (layer is not None or isinstance(module, nn.Upsample))


def _describe_module(module: nn.Module) -> str:
    if isinstance(module, _CONVS):
        return (f"{type(module).__name__}({module.in_channels}->{module.out_channels}, kernel={module.kernel_size}, "
                f"stride={module.stride})")
    if isinstance(module, nn.GroupNorm):
        return f"GroupNorm({module.num_groups})"
    if isinstance(module, (nn.InstanceNorm3d, nn.BatchNorm3d)):
        return f"{type(module).__name__}({module.num_features})"
    activation, parameter, _ = activation_of_module(module)
    if activation in ("leaky_relu", "elu"):
        return f"{type(module).__name__}({parameter:g})"
    return "GELU(tanh)" if activation == "gelu_tanh" else type(module).__name__


@dataclass
class _Match:
    """A chain to fuse: its layers (conv, norm, activation in their order) by position,
    every position it covers (the no-ops between them too), and the fused block; or a
    conv and its norm with running statistics, and the conv they fold into (`kept`: the
    activation after them, which stays)."""

    layers: dict[Any, _Layer]
    positions: list
    block: nn.Module
    kept: str | None = None

    @property
    def folded(self) -> bool:
        return isinstance(self.block, _CONVS)


@dataclass
class _Found:
    """What the passes found: the chains fused and the norms folded (report lines, and
    the folds' matches), and the chains left alone (by path: why)."""

    replaced: list[str] = field(default_factory=list)
    residual_adds: list[str] = field(default_factory=list)
    folded: list[str] = field(default_factory=list)
    folds: list[_Match] = field(default_factory=list)
    replicate_pads: list[str] = field(default_factory=list)
    bias_adds: list[str] = field(default_factory=list)
    kernel_mode: list[str] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)

    def rewrote(self, where: str, match: _Match) -> None:
        layers = list(match.layers.values())
        chain = " + ".join(_describe_module(layer.module) for layer in layers)
        if match.folded:
            kept = f", {match.kept} kept" if match.kept else ""
            self.folded.append(f"{where}: {chain} folded into {type(match.block).__name__}{kept}")
            self.folds.append(match)
        else:
            self.replaced.append(f"{where}: {chain} -> {type(match.block).__name__}")
        for layer in layers:
            self.notes.pop(layer.path, None)


@dataclass
class _Step:
    """The next layer along a chain that is not a no-op, and the positions up to it."""

    positions: list
    layer: _Layer | None


def _step(chain, at, channels: int | None) -> _Step:
    positions = []
    while (at := chain.next(at)) is not None:
        positions.append(at)
        layer = chain.layer(at, channels)
        if layer is None or layer.kind != "noop":
            return _Step(positions, layer)
    return _Step(positions, None)


def _next_of_kind(chain, at, channels: int | None, kind: str, after: str, notes: dict[str, str]) -> _Step | None:
    """The step to the next layer after `at` if it is a `kind` layer that can join the
    chain; notes why one that follows cannot (`after`: what the layer at `at` is)."""
    step = _step(chain, at, channels)
    layer = step.layer
    if layer is not None and layer.kind == "dropout":
        behind = _step(chain, step.positions[-1], channels).layer
        if behind is not None and behind.kind == kind:
            notes[layer.path] = f"{layer.problem} between {after} and {_KIND_TEXT.get(kind, kind)}"
        return None
    if layer is None or layer.kind != kind:
        return None
    if layer.problem:
        notes[layer.path] = layer.problem
        return None
    return step


def _fold_tensors(conv: nn.Module, norm: nn.Module) -> dict[str, Tensor | None]:
    """The tensors a fold reads, by their argument of torch.nn.utils.fusion's
    fuse_conv_bn_weights: the conv's weight and bias, the norm's running mean and
    variance, its affine weight and bias (None where the module has none)."""
    return {"conv_w": conv.weight, "conv_b": conv.bias, "bn_rm": norm.running_mean, "bn_rv": norm.running_var,
            "bn_w": norm.weight, "bn_b": norm.bias}


def _folded_weights(tensors: dict[str, Tensor | None], eps: float, transposed: bool,
                    groups: int) -> tuple[Tensor, Tensor]:
    """The weight and bias of the one convolution that computes a conv (`transposed`: a
    ConvTranspose3d; `groups`: its groups) followed by a norm (`eps`) in eval mode, from
    `tensors` (as `_fold_tensors` gives them: the modules' own, or a checkpoint's),
    computed in float64 and returned in the conv weight's dtype. fuse_conv_bn_weights
    scales a transposed weight's dim 1, which holds one group's output channels: a
    grouped ConvTranspose3d folds group by group."""
    groups = groups if transposed else 1
    split = {name: [None] * groups if t is None else t.detach().double().chunk(groups) for name, t in tensors.items()}
    with torch.no_grad():
        pieces = [fuse_conv_bn_weights(**dict(zip(split, group, strict=True)), bn_eps=eps, transpose=transposed)
                  for group in zip(*split.values(), strict=True)]
    dtype = tensors["conv_w"].dtype
    return torch.cat([w for w, _ in pieces]).to(dtype), torch.cat([b for _, b in pieces]).to(dtype)


def _folded_conv(conv: nn.Module, norm: nn.Module) -> nn.Module:
    """A copy of `conv` (a new module: the model's conv is left as it is) holding the
    folded weight and bias, as new parameters."""
    folded = copy.deepcopy(conv)
    weight, bias = _folded_weights(_fold_tensors(conv, norm), norm.eps, isinstance(conv, nn.ConvTranspose3d),
                                   conv.groups)
    folded.weight = nn.Parameter(weight, requires_grad=conv.weight.requires_grad)
    folded.bias = nn.Parameter(bias, requires_grad=conv.weight.requires_grad)
    return folded


def _fused_block(layers: list[_Layer]) -> nn.Module:
    """The module computing the chain `layers`: a fused block, or for a conv and its norm
    with running statistics the conv they fold into."""
    conv = layers[0].module if layers[0].kind == "conv" else None
    if layers[-1].kind == "running_norm":
        return _folded_conv(conv, layers[-1].module)
    norm = next(layer.module for layer in layers if layer.kind == "norm")
    activation = next((layer.module for layer in layers if layer.kind == "activation"), None)
    if conv is None:
        return GroupNormActivation.from_modules(norm, activation)
    before = layers[1].kind == "activation"
    if type(conv) is nn.ConvTranspose3d and before and type(activation) is nn.ReLU and type(norm) is nn.GroupNorm:
        return ConvTranspose3dReLUGroupNorm.from_modules(conv, norm)
    block_type = ConvTranspose3dNormActivation if type(conv) is nn.ConvTranspose3d else Conv3dNormActivation
    if activation is None:
        activation = nn.Identity().train(conv.training)
    return block_type.from_modules(conv, norm, activation, activation_before_norm=before)


def _matched(steps: list[tuple[Any, _Step]], notes: dict[str, str]) -> _Match | None:
    """The match of the chain `steps` (each layer's position and the step to it), or None
    where the block refuses the modules (noted at the chain's first layer)."""
    layers = {at: step.layer for at, step in steps}
    first = steps[0][1].layer
    try:
        if first.problem:
            raise ValueError(first.problem)
        block = _fused_block(list(layers.values()))
    except (ValueError, TypeError) as error:
        notes[first.path] = str(error).removeprefix("cutlassfuse: ")
        return None
    return _Match(layers, [at for _, step in steps for at in step.positions], block)


def _match_conv(chain, at, conv: _Layer, notes: dict[str, str]) -> _Match | None:
    """conv -> norm -> activation, conv -> norm, or conv -> activation -> norm from `at`."""
    channels = conv.module.out_channels
    start = (at, _Step([at], conv))
    norm = _next_of_kind(chain, at, channels, "norm", "conv", notes)
    if norm is not None:
        activation = _next_of_kind(chain, norm.positions[-1], channels, "activation", "norm", notes)
        steps = [start, (norm.positions[-1], norm)]
        if activation is not None:
            steps.append((activation.positions[-1], activation))
        return _matched(steps, notes)
    activation = _step(chain, at, channels)
    if activation.layer is None or activation.layer.kind != "activation":
        return None
    norm = _next_of_kind(chain, activation.positions[-1], channels, "norm", "activation", notes)
    if norm is None:
        return None
    if activation.layer.problem:
        notes[activation.layer.path] = activation.layer.problem
        return None
    return _matched([start, (activation.positions[-1], activation), (norm.positions[-1], norm)], notes)


def _match_norm(chain, at, norm: _Layer, notes: dict[str, str]) -> _Match | None:
    """A norm -> activation that no convolution takes. GroupNormActivation takes a
    GroupNorm's (N, C, *) input of any spatial rank, and nn.InstanceNorm3d's input is 5-D
    (or unbatched, which the op refuses); F.instance_norm's must be known to be 5-D."""
    activation = _next_of_kind(chain, at, None, "activation", "norm", notes)
    if activation is None:
        return None
    if norm.problem:
        notes[norm.path] = norm.problem
        return None
    any_rank = isinstance(norm.module, nn.GroupNorm) or (type(norm.module) is nn.InstanceNorm3d and not norm.function)
    if not any_rank and not chain.five_d_input(at):
        notes[norm.path] = (f"{_describe_module(norm.module)} -> {_describe_module(activation.layer.module)}: its "
                            "input is not known to be 5-D (N, C, D, H, W)")
        return None
    return _matched([(at, _Step([at], norm)), (activation.positions[-1], activation)], notes)


def _match_fold(chain, at, conv: _Layer, notes: dict[str, str]) -> _Match | None:
    """conv -> a norm with running statistics (in eval mode) from `at`: the norm folds
    into the conv; the activation after it, if any, stays where it is."""
    channels = conv.module.out_channels
    norm = _next_of_kind(chain, at, channels, "running_norm", "conv", notes)
    if norm is None:
        return None
    match = _matched([(at, _Step([at], conv)), (norm.positions[-1], norm)], notes)
    if match is not None:
        after = _step(chain, norm.positions[-1], channels).layer
        if after is not None and after.kind == "activation":
            match.kept = type(after.module).__name__ if after.module is not None else after.name
    return match


def _match_chain(chain, at, layer: _Layer, notes: dict[str, str]) -> _Match | None:
    if layer.kind == "norm":
        return _match_norm(chain, at, layer, notes)
    return _match_conv(chain, at, layer, notes) or _match_fold(chain, at, layer, notes)


def _fuse_chains(chain, positions: list, found: _Found) -> None:
    """Every chain that starts at one of `positions` (in order), fused or folded in `chain`."""
    covered = set()
    for at in positions:
        layer = None if at in covered else chain.layer(at)
        if layer is None or layer.kind not in ("conv", "norm"):
            continue
        match = _match_chain(chain, at, layer, found.notes)
        if match is not None:
            covered.update(match.positions)
            chain.replace(match, found)


def _runs_in_order(module: nn.Module) -> bool:
    """Whether `module` is an nn.Sequential that runs its children one after the other."""
    return isinstance(module, nn.Sequential) and type(module).forward is nn.Sequential.forward


@dataclass
class _Slot:
    parent: nn.Module  # the nn.Sequential holding it
    name: str
    path: str
    module: nn.Module


def _slots(sequential: nn.Module, prefix: str) -> Iterator[_Slot]:
    """The layers `sequential` runs in order, those of nested nn.Sequentials included
    (MONAI's Convolution: the conv, then the norm, dropout and activation of its ADN)."""
    for name, child in sequential._modules.items():
        if child is None:
            continue
        if _runs_in_order(child):
            yield from _slots(child, f"{prefix}{name}.")
        else:
            yield _Slot(sequential, name, f"{prefix}{name}", child)


class _SequentialRun:
    """The chain positions of one run of nn.Sequential layers: slot indices. A fused
    block takes its first layer's slot, the others' become nn.Identity, so that the
    layers after them keep their indices."""

    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots
        self.layers = [_module_layer(slot.module, slot.path) for slot in slots]
        self.input_five_d = [False]
        for slot, layer in zip(slots, self.layers, strict=True):
            self.input_five_d.append(_five_d_after(slot.module, layer, self.input_five_d[-1]))

    def layer(self, at: int, channels: int | None = None) -> _Layer | None:
        return self.layers[at]

    def next(self, at: int) -> int | None:
        return at + 1 if at + 1 < len(self.slots) else None

    def five_d_input(self, at: int) -> bool:
        return self.input_five_d[at]

    def replace(self, match: _Match, found: _Found) -> None:
        for i, (at, layer) in enumerate(match.layers.items()):
            slot = self.slots[at]
            slot.parent._modules[slot.name] = match.block if i == 0 else nn.Identity().train(layer.module.training)
        found.rewrote(self.slots[next(iter(match.layers))].path, match)


def _fuse_sequentials(module: nn.Module, prefix: str, found: _Found) -> None:
    """Fuses the chains of every nn.Sequential in `module`, in place."""
    if not _runs_in_order(module):
        for name, child in module.named_children():
            _fuse_sequentials(child, f"{prefix}{name}.", found)
        return
    slots = list(_slots(module, prefix))
    _fuse_chains(_SequentialRun(slots), list(range(len(slots))), found)
    for slot in slots:
        _fuse_sequentials(slot.module, f"{slot.path}.", found)


def _type_check_of_traced_values(check):
    """torch.jit.isinstance while tracing: a traced value is a torch.fx.Proxy, not the
    tensor it stands for, so asking its type would silently take the wrong branch (MONAI's
    UpCat would skip its skip connection's cat, were it not traced through its stand-in);
    such a forward() is refused."""

    def checked(obj: Any, target_type: Any) -> bool:
        if isinstance(obj, torch.fx.Proxy):
            raise torch.fx.proxy.TraceError("forward() asks the type of a traced value (torch.jit.isinstance), "
                                            "which a trace cannot answer")
        return check(obj, target_type)

    return checked


class _Tracer(torch.fx.Tracer):
    """Keeps already fused blocks (from the Sequential pass), modules with hooks (a call of
    the module runs its hooks; a trace through its forward() would not) and the modules
    in `calls` opaque, traces the stand-ins of library modules whose forward() no trace
    can follow (traceable_forwards), and refuses other code that asks the type of a
    traced value."""

    def __init__(self, calls: Collection[nn.Module] = ()) -> None:
        super().__init__()
        self.calls = calls

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return (isinstance(module, _FUSED) or _has_hooks(module) or any(module is call for call in self.calls)
                or super().is_leaf_module(module, qualified_name))

    def call_module(self, m: nn.Module, forward: Any, args: tuple, kwargs: dict) -> Any:
        replacement = stand_in(m)
        if replacement is not None:
            forward = functools.partial(replacement, m)
        return super().call_module(m, forward, args, kwargs)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        check = torch.jit.isinstance
        torch.jit.isinstance = _type_check_of_traced_values(check)
        try:
            return super().trace(root, concrete_args)
        finally:
            torch.jit.isinstance = check


def _unused_name(module: nn.Module, name: str) -> str:
    candidate, n = name, 1
    while hasattr(module, candidate):
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _bind(node: torch.fx.Node, defaults: dict[str, Any]) -> dict[str, Any] | None:
    """The call's arguments by name (`defaults`: those after the input, with their
    defaults), or None for a call that passes others or no input."""
    names = ["input", *defaults]
    if len(node.args) > len(names) or not node.kwargs.keys() <= set(names):
        return None
    bound = dict(zip(names, node.args, strict=False))
    if bound.keys() & node.kwargs.keys():
        return None
    bound.update(node.kwargs)
    return {**defaults, **bound} if "input" in bound else None


def _constant(value: Any) -> bool:
    return not isinstance(value, torch.fx.Node)


def _parameter(graph_module: nn.Module, node: Any) -> nn.Parameter | None:
    """The model's parameter that `node` reads, None where it reads anything else."""
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        return None
    try:
        return graph_module.get_parameter(node.target)
    except AttributeError:
        return None


class _TracedChain:
    """The chain positions of a torch.fx trace: its nodes. A layer's successor is the one
    user of its output, where that user reads it as its input."""

    def __init__(self, graph_module: torch.fx.GraphModule, prefix: str = "") -> None:
        self.graph_module = graph_module
        self.prefix = prefix  # the traced module's path in the model, for the report
        self.modules = dict(graph_module.named_modules())
        self.layers: dict[tuple, _Layer | None] = {}
        self.five_d: set[torch.fx.Node] = set()
        for node in graph_module.graph.nodes:
            if self._five_d_output(node):
                self.five_d.add(node)

    def layer(self, node: torch.fx.Node, channels: int | None = None) -> _Layer | None:
        """What `node` is in a chain (`channels`: the conv's, for a functional norm without
        weight); the same object for the same question."""
        key = (node, channels)
        if key not in self.layers:
            self.layers[key] = self._classify(node, channels)
        return self.layers[key]

    def next(self, node: torch.fx.Node) -> torch.fx.Node | None:
        if len(node.users) != 1:
            return None
        user = next(iter(node.users))
        layer = self.layer(user)
        return user if layer is not None and layer.input is node else None

    def five_d_input(self, node: torch.fx.Node) -> bool:
        return self._known_five_d(self.layer(node).input)

    def _known_five_d(self, value: Any) -> bool:
        return isinstance(value, torch.fx.Node) and value in self.five_d

    def _five_d_output(self, node: torch.fx.Node) -> bool:
        if node.op not in ("call_module", "call_function", "call_method"):
            return False
        if node.target in _ELEMENTWISE or (node.op == "call_method" and node.target in _ELEMENTWISE_METHODS):
            return bool(node.all_input_nodes) and all(n in self.five_d for n in node.all_input_nodes)
        first = node.args[0] if node.args else node.kwargs.get("input")
        if node.op == "call_module":
            return _five_d_after(self.modules[node.target], self.layer(node), self._known_five_d(first))
        return self._known_five_d(first) and (self.layer(node) is not None or node.target in _SAME_RANK_FUNCTIONS)

    def _classify(self, node: torch.fx.Node, channels: int | None) -> _Layer | None:
        if node.op == "call_module":
            return self._module_layer(node)
        if node.op == "call_method" and node.target in _ACTIVATION_METHODS and len(node.args) == 1 and not node.kwargs:
            return self._function_layer(node, "activation", nn.ReLU())
        if node.op != "call_function":
            return None
        if node.target in _ACTIVATION_FUNCTIONS:
            return self._activation_function(node)
        if node.target in _NORM_FUNCTIONS:
            return self._norm_function(node, channels)
        return None

    def _module_layer(self, node: torch.fx.Node) -> _Layer | None:
        layer = _module_layer(self.modules[node.target], node.target)
        if layer is None:
            return None
        layer.path = self.prefix + layer.path
        if layer.kind != "conv":
            if len(node.args) != 1 or node.kwargs:
                return None
            layer.input, layer.call = node.args[0], ((node.args[0],), {})
            return layer
        bound = _bind(node, {"output_size": None} if type(layer.module) is nn.ConvTranspose3d else {})
        if bound is None:
            layer.problem = "the conv is called with other arguments than a fused block takes"
            return layer
        output_size = bound.get("output_size")
        layer.input = bound["input"]
        layer.call = (layer.input,), ({} if output_size is None else {"output_size": output_size})
        return layer

    def _function_layer(self, node: torch.fx.Node, kind: str, module: nn.Module | None,
                        problem: str | None = None) -> _Layer:
        """A function call's layer, `module` computing it (with the tensors it reads)."""
        # torch.fx records the modules whose forward() the call is in: path, type.
        owner = next(reversed(node.meta.get("nn_module_stack", {}).values()), ("",))[0]
        path = self.prefix + (f"{owner}.forward(): {node.name}" if owner else f"forward(): {node.name}")
        if module is not None:
            module.train(self.graph_module.training)
        input = node.args[0] if node.args else node.kwargs.get("input")
        return _Layer(kind, path, f"{owner}.{node.name}" if owner else node.name, module, problem, input,
                      ((input,), {}), function=True)

    def _activation_function(self, node: torch.fx.Node) -> _Layer | None:
        activation, defaults = _ACTIVATION_FUNCTIONS[node.target]
        bound = _bind(node, defaults)
        if bound is None or not all(_constant(bound[name]) for name in bound if name not in ("input", "weight")):
            return None
        if activation == "gelu":
            activation = {"none": "gelu", "tanh": "gelu_tanh"}.get(bound["approximate"])
            if activation is None:
                return None
        if activation != "prelu":
            parameter = bound.get("negative_slope", bound.get("alpha"))
            return self._function_layer(node, "activation", _activation_module(activation, parameter, 1, 1, {}))
        weight = _parameter(self.graph_module, bound["weight"])
        if weight is None:
            return self._function_layer(node, "activation", None, "F.prelu's weight is not a parameter of the model")
        module = _activation_module("prelu", None, weight.numel(), weight.numel(), {})
        module.weight = weight
        return self._function_layer(node, "activation", module)

    def _norm_function(self, node: torch.fx.Node, channels: int | None) -> _Layer | None:
        """F.group_norm or F.instance_norm as the module computing it, holding the model's
        weight and bias; the channels are the weight's or bias's, else the conv's."""
        bound = _bind(node, _NORM_FUNCTIONS[node.target])
        tensor_names = ("input", "weight", "bias", "running_mean", "running_var")
        if bound is None or not all(_constant(bound[name]) for name in bound if name not in tensor_names):
            return None
        function = f"F.{node.target.__name__}"
        parameters = {name: _parameter(self.graph_module, bound[name]) for name in ("weight", "bias")
                      if bound[name] is not None}
        problem = next((f"{function}'s {name} is not a parameter of the model" for name, parameter in
                        parameters.items() if parameter is None), None)
        if node.target is F.instance_norm and (bound["running_mean"] is not None or bound["running_var"] is not None
                                               or not bound["use_input_stats"]):
            problem = f"{function} with running statistics"
        channels = next((p.numel() for p in parameters.values() if p is not None), channels)
        if problem is None and channels is None:
            problem = f"{function} without weight or bias: its channel count is not known here"
        if problem is not None:
            return self._function_layer(node, "norm", None, problem)
        try:
            module = _norm_module("group" if node.target is F.group_norm else "instance", channels,
                                  bound.get("num_groups"), bound["eps"], False, {})
        except (ValueError, TypeError) as error:
            return self._function_layer(node, "norm", None, str(error).removeprefix("cutlassfuse: "))
        for name, parameter in parameters.items():
            setattr(module, name, parameter)
        module.affine = bool(parameters)
        return self._function_layer(node, "norm", module)

    def replace(self, match: _Match, found: _Found) -> None:
        """The chain's nodes become one call of the fused block, where the chain starts
        (its input is ready there, and anything written in place later reads the same)."""
        graph = self.graph_module.graph
        layers = list(match.layers.values())
        target = self._fused_target(layers)
        self.graph_module.add_submodule(target, match.block)
        with graph.inserting_before(match.positions[0]):
            fused = graph.call_module(target, *layers[0].call)
        match.positions[-1].replace_all_uses_with(fused)
        # The chain's readers now read the fused block: what they are is asked anew.
        self.layers = {key: layer for key, layer in self.layers.items() if key[0] not in fused.users}
        attributes = dict.fromkeys(n for node in match.positions for n in node.all_input_nodes if n.op == "get_attr")
        for node in reversed(match.positions):
            graph.erase_node(node)
        for node in attributes:
            if not node.users:
                graph.erase_node(node)
        self.five_d.add(fused)
        found.rewrote(self.prefix + target, match)

    def _fused_target(self, layers: list[_Layer]) -> str:
        """Where the fused block goes: in the innermost module holding all the chain's
        layers, named after them (the activation by its kind), as `conv1_conv_norm1_relu`."""
        names = [layer.name.split(".") for layer in layers]
        scope = os.path.commonprefix([parts[:-1] for parts in names])  # of lists: the common leading parts
        name = "_".join(activation_of_module(layer.module)[0] if layer.kind == "activation"
                        else "_".join(parts[len(scope):]) for layer, parts in zip(layers, names, strict=True))
        try:
            owner = self.graph_module.get_submodule(".".join(scope))
        except AttributeError:
            owner = None  # add_submodule makes it
        return ".".join([*scope, _unused_name(owner, name) if owner is not None else name])


class _ModeDependentForward(Exception):
    pass


def _trace_in_either_mode(model: nn.Module, calls: Collection[nn.Module] = ()) -> torch.fx.Graph:
    """A torch.fx trace of forward() (the modules in `calls` kept as calls) that holds in
    train and eval mode alike. Tracing
    runs forward() once, so a branch on `self.training` would be frozen as traced and
    the rewritten model would ignore later train()/eval() calls there: such models are
    traced in both modes and refused when the graphs differ. Every module's own flag is
    restored afterwards (a model may hold eval-mode parts while training)."""
    flags = {module: module.training for module in model.modules()}
    try:
        graphs = [_Tracer(calls).trace(model.train(mode)) for mode in (model.training, not model.training)]
    finally:
        for module, flag in flags.items():
            module.training = flag
    if str(graphs[0]) != str(graphs[1]):
        raise _ModeDependentForward("forward() takes different paths in train and eval mode (self.training), "
                                    "which a trace would freeze")
    return graphs[0]


def _fuse_graph(graph_module: torch.fx.GraphModule, model: nn.Module, found: _Found, prefix: str = "") -> nn.Module:
    """The same rewrite in a torch.fx trace of `model`'s forward() (`model` at `prefix` in
    the model fuse() takes), for chains written in code: the modules, and the functional
    norms and activations, each intermediate used once. The rewritten trace where it
    fused a chain, or where it calls a block that the nn.Sequential rewrite fused and
    `model` is not a plain nn.Sequential (whose rewrite in place keeps its indexing);
    `model` elsewhere. The trace calls the layers themselves: the containers around them
    (nn.Sequential, MONAI's Convolution and ADN, ...) and the calls that return their
    input go, each a module call of host time, which networks of small layers feel."""
    rewritten_before = len(found.replaced) + len(found.folded)
    _fuse_chains(_TracedChain(graph_module, prefix), list(graph_module.graph.nodes), found)
    pads_replaced = _replace_replicate_pads(graph_module, found, prefix)
    calls_block = type(model) is not nn.Sequential and any(
        node.op == "call_module" and isinstance(graph_module.get_submodule(node.target), _FUSED)
        for node in graph_module.graph.nodes)
    if len(found.replaced) + len(found.folded) == rewritten_before and not calls_block and not pads_replaced:
        return model
    _drop_calls_returning_input(graph_module)
    _fuse_residual_adds(graph_module, found, prefix)
    _split_conv_biases(graph_module, found, prefix)
    _contiguous_in_layout(graph_module)
    graph_module.graph.lint()
    graph_module.delete_all_unused_submodules()
    graph_module.recompile()
    return graph_module


def _drop_calls_returning_input(graph_module: torch.fx.GraphModule) -> None:
    """Takes the calls of modules that return their input (`_returns_input`, without
    hooks) out of the trace, their users reading the input instead."""
    for node in list(graph_module.graph.nodes):
        one_node_argument = len(node.args) == 1 and not node.kwargs and isinstance(node.args[0], torch.fx.Node)
        if node.op != "call_module" or not one_node_argument:
            continue
        module = graph_module.get_submodule(node.target)
        if _returns_input(module) and not _has_hooks(module):
            node.replace_all_uses_with(node.args[0])
            graph_module.graph.erase_node(node)


def _replicate_pad(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[Any, list[int], str] | None:
    """(input, pads, what) where `node` pads a tensor by replicating its border with six
    constant pads: F.pad(x, pad, mode="replicate"), or a call of an nn.ReplicationPad3d
    without hooks."""
    if node.op == "call_function" and node.target is F.pad:
        bound = _bind(node, {"pad": None, "mode": "constant", "value": None})
        if bound is None or bound["mode"] != "replicate" or bound["value"] is not None:
            return None
        pad = bound["pad"]
        if isinstance(pad, (tuple, list)) and len(pad) == 6 and all(type(p) is int for p in pad):
            return bound["input"], list(pad), f"F.pad(mode='replicate', pad={tuple(pad)})"
        return None
    if node.op == "call_module" and len(node.args) == 1 and not node.kwargs:
        module = graph_module.get_submodule(node.target)
        if type(module) is nn.ReplicationPad3d and not _has_hooks(module):
            return node.args[0], list(module.padding), f"ReplicationPad3d({tuple(module.padding)})"
    return None


def _only_convolved(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether every user of `node` calls a convolution (nn.Conv3d, nn.ConvTranspose3d or a
    fused block, without hooks) on it: none writes to it or returns it."""
    for user in node.users:
        if user.op != "call_module":
            return False
        module = graph_module.get_submodule(user.target)
        if not (type(module) in _CONVS or isinstance(module, _FUSED)) or _has_hooks(module):
            return False
    return bool(node.users)


def _replace_replicate_pads(graph_module: torch.fx.GraphModule, found: _Found, prefix: str) -> bool:
    """Makes each replicate pad of the trace (`_replicate_pad`) a call of
    torch.ops.cutlassfuse.replication_pad3d, which pads as ATen's replication_pad3d does
    (the same values, layout and derivatives), several times faster on CUDA; a pad of
    zeros that only convolutions read (a causal 1x1x1 convolution's) is dropped, its
    copy of the input unread. Whether it changed any."""
    graph = graph_module.graph
    replaced = False
    for node in list(graph.nodes):
        pad = _replicate_pad(graph_module, node)
        if pad is None:
            continue
        value, padding, what = pad
        stack = node.meta.get("nn_module_stack")  # the modules whose forward() made the call
        where = f"{prefix}{next(reversed(stack))}" if stack else prefix.rstrip(".") or node.name
        if not any(padding) and _only_convolved(graph_module, node):
            node.replace_all_uses_with(value)
            found.replicate_pads.append(f"{where}: {what} -> dropped (pads nothing, read by convolutions only)")
        else:
            with graph.inserting_before(node):
                padded = graph.call_function(REPLICATION_PAD3D, (value, padding))
            padded.meta = dict(node.meta)
            node.replace_all_uses_with(padded)
            found.replicate_pads.append(f"{where}: {what} -> cutlassfuse replication_pad3d")
        graph.erase_node(node)
        replaced = True
    return replaced


def _added_tensors(node: torch.fx.Node) -> tuple | None:
    """The two operands of an out-of-place or in-place add of two traced values (``a + b``,
    ``a += b``, ``torch.add(a, b)``, ``a.add(b)``, without alpha), else None."""
    is_add = (node.op == "call_function" and node.target in (operator.add, operator.iadd, torch.add)) or (
        node.op == "call_method" and node.target in ("add", "add_"))
    if not is_add or len(node.args) != 2 or node.kwargs:
        return None
    return node.args if all(isinstance(a, torch.fx.Node) for a in node.args) else None


def _block_called_once(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    """Whether `node` calls a conv block (without hooks, with no residual yet) whose output
    nothing else reads."""
    if node.op != "call_module" or len(node.users) != 1 or "residual" in node.kwargs:
        return False
    module = graph_module.get_submodule(node.target)
    return isinstance(module, _ConvNormActivation) and not _has_hooks(module)


def _fuse_residual_adds(graph_module: torch.fx.GraphModule, found: _Found, prefix: str) -> None:
    """A conv block's output added to another value (MONAI's ResidualUnit, DynUNet's
    residual blocks) becomes the block's call with that value as its ``residual``: the op
    adds it as it writes the output where it fits, PyTorch's add elsewhere, one pass over
    the output fewer. The block's output must have no other reader: an in-place add then
    writes only what it alone would have read."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        operands = _added_tensors(node)
        if operands is None:
            continue
        for block_call, residual in (operands, operands[::-1]):
            if not _block_called_once(graph_module, block_call):
                continue
            with graph.inserting_before(node):
                summed = graph.call_module(block_call.target, block_call.args,
                                           {**block_call.kwargs, "residual": residual})
            node.replace_all_uses_with(summed)
            graph.erase_node(node)
            graph.erase_node(block_call)
            found.residual_adds.append(f"{prefix}{block_call.target}: + {residual.name} -> the block's residual")
            break


def _conv_with_bias(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> nn.Conv3d | None:
    """The nn.Conv3d that `node` calls on one traced value, where it has a bias, zero
    padding and no hooks."""
    if node.op != "call_module" or len(node.args) != 1 or node.kwargs or not isinstance(node.args[0], torch.fx.Node):
        return None
    module = graph_module.get_submodule(node.target)
    if type(module) is not nn.Conv3d or module.bias is None or module.padding_mode != "zeros" or _has_hooks(module):
        return None
    return module


def _added_residual(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """(the add, the other operand) where `node`'s output is read once, by an add of
    another traced value that writes no tensor but `node`'s (an in-place add only of
    `node`'s output)."""
    if len(node.users) != 1:
        return None
    add = next(iter(node.users))
    operands = _added_tensors(add)
    if operands is None or operands[0] is operands[1]:
        return None
    in_place = add.target in (operator.iadd, "add_")
    if operands[0] is node:
        return add, operands[1]
    return None if in_place else (add, operands[0])


def _split_conv_biases(graph_module: torch.fx.GraphModule, found: _Found, prefix: str) -> None:
    """Each traced nn.Conv3d with a bias (`_conv_with_bias`) becomes a call of
    `conv3d_bias_add`: on CUDA its convolution without the bias, then
    torch.ops.cutlassfuse.bias_add; where an add of another value reads its output alone (a
    resnet's conv2(h) + shortcut), that value joins the call as its residual. ATen adds a
    convolution's bias after cuDNN's convolution in a pass of its own, at about half of
    memory bandwidth, and the residual add is another pass; the op adds both in one. The
    module stays where it was, its parameters read from it."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        conv = _conv_with_bias(graph_module, node)
        if conv is None:
            continue
        added = _added_residual(node)
        add, residual = added if added else (None, None)
        with graph.inserting_before(add or node):
            weight = graph.get_attr(f"{node.target}.weight")
            bias = graph.get_attr(f"{node.target}.bias")
            summed = graph.call_function(conv3d_bias_add, (node.args[0], weight, bias, conv.stride, conv.padding,
                                                           conv.dilation, conv.groups, residual))
        summed.meta = dict((add or node).meta)
        (add or node).replace_all_uses_with(summed)
        if add is not None:
            graph.erase_node(add)
        graph.erase_node(node)
        found.bias_adds.append(f"{prefix}{node.target}: Conv3d's bias" + (f" + {residual.name}" if residual else "")
                               + " -> cutlassfuse bias_add")


# Calls whose values do not depend on their inputs' strides, and that read no tensor's
# memory as laid out: a `.contiguous()` that only they read may keep its input's layout.
_STRIDE_AGNOSTIC_FUNCTIONS = {operator.add, operator.iadd, torch.add, operator.mul, torch.mul, F.pad, F.silu,
                              F.group_norm, F.interpolate, torch.cat, REPLICATION_PAD3D, conv3d_bias_add}
_STRIDE_AGNOSTIC_MODULES = (*_CONVS, *_NORMS, *_FUSED, nn.SiLU, nn.ReLU, nn.ReplicationPad3d)


def _stride_agnostic(graph_module: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in _STRIDE_AGNOSTIC_FUNCTIONS
    if node.op == "call_method":
        return node.target in ("add", "mul")
    if node.op == "call_module":
        module = graph_module.get_submodule(node.target)
        return isinstance(module, _STRIDE_AGNOSTIC_MODULES) and not _has_hooks(module)
    return False


@opaque_to_tracing
def _packed_in_its_layout(x: Any) -> Any:
    """``x.contiguous()`` in the layout PyTorch suggests for it: channels-last stays
    channels-last."""
    return x.contiguous(memory_format=suggest_memory_format(x)) if isinstance(x, Tensor) and x.dim() == 5 else (
        x.contiguous())


def _contiguous_in_layout(graph_module: torch.fx.GraphModule) -> None:
    """A traced ``x.contiguous()`` that only stride-agnostic calls read (diffusers'
    HunyuanVideo resnets make their input contiguous before the norm and the residual
    add) packs x in its own layout instead of NCDHW: the same values, and channels-last
    activations stay channels-last rather than being transposed to NCDHW and back."""
    graph = graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_method" or node.target != "contiguous" or len(node.args) != 1 or node.kwargs:
            continue
        if not node.users or not all(_stride_agnostic(graph_module, user) for user in node.users):
            continue
        with graph.inserting_before(node):
            packed = graph.call_function(_packed_in_its_layout, (node.args[0],))
        packed.meta = dict(node.meta)
        node.replace_all_uses_with(packed)
        graph.erase_node(node)


@dataclass
class _SaveOriginalKeys:
    """state_dict post-hook: every tensor under its key in the original model."""

    holders: dict[str, list[str]]  # original key -> the keys holding its tensor now, relative to the hooked module

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        held = {holder for holders in self.holders.values() for holder in holders}
        if not any(prefix + key in state_dict for key in held):
            return
        # The original keys in the original order; keys of tensors added since, after them.
        section = {key[len(prefix):]: state_dict.pop(key) for key in list(state_dict) if key.startswith(prefix)}
        for original, holders in self.holders.items():
            if holders[0] in section:
                state_dict[prefix + original] = section[holders[0]]
        state_dict.update((prefix + key, value) for key, value in section.items() if key not in held)


@dataclass
class _LoadOriginalKeys:
    """load_state_dict pre-hook: a state_dict with the original keys loads into the
    rewritten model (one with its own keys still loads as it is)."""

    holders: dict[str, list[str]]  # original key -> the keys holding its tensor now (a conv in two chains: two)

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
        for original, holders in self.holders.items():
            if prefix + original in state_dict:
                for holder in holders:
                    state_dict.setdefault(prefix + holder, state_dict[prefix + original])
                if original not in holders:
                    del state_dict[prefix + original]


@dataclass
class _FoldKeys:
    """One fold, for loading checkpoints: the original model's keys of the tensors it
    reads (by `_fold_tensors`' names, None where the module has none), the original keys
    of the conv's and the norm's tensors that the rewritten model holds no more, the
    keys of the folded conv's weight and bias, and `_folded_weights`' other arguments."""

    sources: dict[str, str | None]
    stale: list[str]
    weight: list[str]
    bias: list[str]
    eps: float
    transposed: bool
    groups: int


def _fold_keys(match: _Match, original: dict[str, Tensor], state: dict[str, Tensor]) -> _FoldKeys:
    """`match`'s fold in `original` (before the rewrite) and `state` (after it), both
    state_dict(keep_vars=True)."""
    conv, norm = (layer.module for layer in match.layers.values())
    originals: dict[int, list[str]] = {}
    for key, tensor in original.items():
        originals.setdefault(id(tensor), []).append(key)
    held = {id(tensor) for tensor in state.values()}
    gone = [tensor for tensor in [*conv.state_dict(keep_vars=True).values(), *norm.state_dict(keep_vars=True).values()]
            if id(tensor) not in held]
    return _FoldKeys({name: originals.get(id(tensor), [None])[0] for name, tensor in _fold_tensors(conv, norm).items()},
                     [key for tensor in gone for key in originals.get(id(tensor), [])],
                     [key for key, tensor in state.items() if tensor is match.block.weight],
                     [key for key, tensor in state.items() if tensor is match.block.bias],
                     norm.eps, isinstance(conv, nn.ConvTranspose3d), conv.groups)


@dataclass
class _RefoldOnLoad:
    """load_state_dict pre-hook: a state_dict of the original model (each folded conv
    and its norm under their own keys, running statistics included) loads into the
    rewritten model, the folded convs' weights and biases folded anew from its tensors.
    A state_dict of the rewritten model (the folded convs, no norm) loads as it is."""

    folds: list[_FoldKeys]

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
        for fold in self.folds:
            sources = {name: key and prefix + key for name, key in fold.sources.items()}
            if sources["bn_rm"] is None or not all(key in state_dict for key in sources.values() if key):
                continue
            tensors = {name: key and state_dict[key] for name, key in sources.items()}
            for key in fold.stale:
                state_dict.pop(prefix + key, None)
            weight, bias = _folded_weights(tensors, fold.eps, fold.transposed, fold.groups)
            state_dict.update((prefix + key, weight) for key in fold.weight)
            state_dict.update((prefix + key, bias) for key in fold.bias)


def _fuse_traced_children(module: nn.Module, prefix: str, found: _Found, calls: list[nn.Module]) -> list[str]:
    """For a `module` torch.fx cannot trace whole: each child's forward() code traced on
    its own, the chains found there fused and the child replaced by its rewritten trace;
    a child that cannot be traced whole is fused in parts in turn (`_fuse_in_parts`) and
    appended, as it then stands, to `calls`. torch.nn's own modules hold no chains in code
    and are not traced. The paths of the modules replaced by a trace."""
    replaced = []
    for name, child in list(module.named_children()):
        path = f"{prefix}{name}"
        if type(child).__module__.startswith("torch.nn"):
            replaced += _fuse_traced_children(child, f"{path}.", found, calls)
            continue
        try:
            graph = _trace_in_either_mode(child)
        except Exception:  # torch.fx raises many types for untraceable code
            fused, paths = _fuse_in_parts(child, path, found)
            replaced += paths
            if fused is child:  # its own code untraced: its memory-bound ops run on cutlassfuse's kernels
                fused = _under_kernel_mode(child, path, found)
            calls.append(fused)
        else:
            fused = _fused_trace(child, graph, found, f"{path}.")
            replaced += [path] if fused is not child else []
        if fused is not child:
            setattr(module, name, fused)
    return replaced


def _under_kernel_mode(module: nn.Module, path: str, found: _Found) -> WithKernelMode:
    """`module` (at `path`), whose own code is untraced, wrapped in WithKernelMode. Its
    descendants wrapped before it are unwrapped, and their report lines dropped: the one
    mode covers them, where nested modes would each intercept every op of the inner code."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, WithKernelMode):
                setattr(parent, name, child.module)
    found.kernel_mode[:] = [line for line in found.kernel_mode if not line.startswith(f"{path}.")]
    found.kernel_mode.append(f"{path}: {type(module).__name__}'s untraced code: ATen's replicate pads, "
                             "nearest upsampling and convolution bias adds -> cutlassfuse's kernels, "
                             "where its first CUDA call finds that they pay")
    return WithKernelMode(module)


def _fused_trace(module: nn.Module, graph: torch.fx.Graph, found: _Found, prefix: str) -> nn.Module:
    """`_fuse_graph` of `module`'s trace `graph` (`module` at `prefix`): the rewritten
    trace, holding every tensor of `module`, or `module` where nothing changed."""
    fused = _fuse_graph(torch.fx.GraphModule(module, graph, type(module).__name__), module, found, prefix)
    if fused is not module:
        _keep_unused_tensors(fused, module, found.folds)
    return fused


def _fuse_in_parts(module: nn.Module, path: str, found: _Found) -> tuple[nn.Module, list[str]]:
    """`module` (at `path`; "" for the model itself), which torch.fx cannot trace whole,
    fused in parts: its children on their own (`_fuse_traced_children`), then its own
    forward() traced with the children that cannot be traced whole kept as calls, where
    that trace holds (a branch on a traced value lies inside those children), and the
    chains and pads of its own code fused there (a decoder's last norm and activation).
    The module or its rewritten trace, and the paths of the modules replaced by a trace."""
    prefix = f"{path}." if path else ""
    calls: list[nn.Module] = []
    replaced = _fuse_traced_children(module, prefix, found, calls)
    try:
        graph = _trace_in_either_mode(module, calls)
    except Exception:  # its own code cannot be traced either
        return module, replaced
    fused = _fused_trace(module, graph, found, prefix)
    return fused, replaced + ([path] if fused is not module else [])


def _keep_original_keys(model: nn.Module, original: dict[str, torch.Tensor], folds: list[_Match]) -> None:
    """Hooks the rewritten `model`'s state_dict() and load_state_dict() to the keys of
    `original` (the state_dict(keep_vars=True) of the model before the rewrite): each
    key's tensor is found by identity, wherever the rewrite put it (a fused block, a
    module the model registers twice and a trace keeps once). A checkpoint of the
    original model refolds the `folds`' convs as it loads."""
    state = model.state_dict(keep_vars=True)
    if folds:
        model.register_load_state_dict_pre_hook(_RefoldOnLoad([_fold_keys(match, original, state) for match in folds]))
    holders: dict[int, list[str]] = {}
    for key, tensor in state.items():
        holders.setdefault(id(tensor), []).append(key)
    keys = {key: holders[id(tensor)] for key, tensor in original.items() if id(tensor) in holders}
    if all(holder == [key] for key, holder in keys.items()) and len(keys) == sum(map(len, holders.values())):
        return
    model.register_state_dict_post_hook(_SaveOriginalKeys(keys))
    model.register_load_state_dict_pre_hook(_LoadOriginalKeys(keys))


def _keep_unused_tensors(graph_module: nn.Module, model: nn.Module, folds: list[_Match]) -> None:
    """The tensors of `model` (traced into `graph_module`) that the trace dropped (of
    modules forward() does not call), put back at their paths in plain modules, so that
    checkpoints keep them; not those of the convs and norms the trace folded (`folds`),
    which the folded convs replace."""
    held = {id(tensor) for tensor in graph_module.state_dict(keep_vars=True).values()}
    folded = {id(tensor) for match in folds for layer in match.layers.values()
              for tensor in layer.module.state_dict(keep_vars=True).values()}
    missing = {id(tensor) for tensor in model.state_dict(keep_vars=True).values()} - held - folded
    for path, module in model.named_modules(remove_duplicate=False):
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is None or id(tensor) not in missing:
                continue
            try:
                holder = graph_module.get_submodule(path)
            except AttributeError:
                graph_module.add_submodule(path, nn.Module())
                holder = graph_module.get_submodule(path)
            if isinstance(tensor, nn.Parameter):
                holder.register_parameter(name, tensor)
            else:
                holder.register_buffer(name, tensor)
            missing.discard(id(tensor))


def _map_5d_tensors(value: Any, function: Callable[[Tensor], Tensor], *, in_place: bool = False) -> Any:
    """``value`` with ``function`` applied to its 5-D tensors (tuples, lists and dicts kept;
    with ``in_place``, its lists and dicts themselves updated)."""
    if isinstance(value, Tensor):
        return function(value) if value.dim() == 5 else value
    if in_place and isinstance(value, list):
        value[:] = [_map_5d_tensors(item, function, in_place=True) for item in value]
        return value
    if in_place and isinstance(value, dict):
        value.update((key, _map_5d_tensors(item, function, in_place=True)) for key, item in value.items())
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_map_5d_tensors(item, function, in_place=in_place) for item in value)
    if isinstance(value, dict):
        return {key: _map_5d_tensors(item, function, in_place=in_place) for key, item in value.items()}
    return value


def _contiguous_outputs(output: Any) -> Any:
    """The forward's outputs with their 5-D tensors NCDHW."""
    return _map_5d_tensors(output, Tensor.contiguous)


def _state_in_channels_last(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook of an untraced model whose activations run channels-last: its 5-D
    tensor arguments after the first channels-last. They are state a caller hands back (a
    video decoder's frame caches, which the model returned in its input's layout): NCDHW,
    they would mix layouts with the activations they meet (a concatenation of both writes
    NCDHW, and every convolution after it converts)."""
    def channels_last(tensor: Tensor) -> Tensor:
        return tensor.contiguous(memory_format=torch.channels_last_3d)

    # A list or dict argument is the caller's object: the model may write its state into it
    # (Wan's decoder stores its frame caches in the list it is handed), so it is updated in
    # place.
    return ((*args[:1], *_map_5d_tensors(args[1:], channels_last, in_place=True)),
            _map_5d_tensors(kwargs, channels_last, in_place=True))


@opaque_to_tracing
def _outputs_in_layout_of(x: Any, output: Any) -> Any:
    """``output`` with its 5-D tensors NCDHW where the model's input ``x`` is one PyTorch
    reads as NCDHW, as the original model's (a one-channel input is contiguous in both
    layouts, and read as NCDHW unless its strides are channels-last's)."""
    if isinstance(x, Tensor) and x.dim() == 5 and not _reads_as_channels_last(x):
        return _contiguous_outputs(output)
    return output


def _outputs_in_input_layout(module: nn.Module, args: tuple, output: Any) -> Any:
    """Forward hook of an untraced model whose activations run channels-last."""
    return _outputs_in_layout_of(args[0] if args else None, output)


def _output_through(graph_module: torch.fx.GraphModule, function) -> None:
    """The traced model's output passes through ``function(first input, output)``: a node
    of the graph, which its code, and so a pickled copy, keeps (a hook would not be)."""
    graph = graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if not placeholders:
        return
    output = next(node for node in graph.nodes if node.op == "output")
    with graph.inserting_before(output):
        value = graph.call_function(function, (placeholders[0], output.args[0]))
    output.args = (value,)
    graph_module.recompile()


def _reads_as_channels_last(x: Tensor) -> bool:
    """Whether PyTorch's convolutions read ``x`` as channels_last_3d (a one-channel tensor
    is contiguous in both layouts, and read as such only with channels-last's strides)."""
    return suggest_memory_format(x) == torch.channels_last_3d


def _channels_last_strides(tensor: Tensor) -> Tensor:
    """``tensor`` with channels_last_3d's strides exactly. ``Tensor.contiguous`` keeps a
    one-channel tensor as it is (both layouts at once), and PyTorch reads its layout as
    NCDHW: a first layer's weight (C_out, 1, k, k, k) would make its convolution write
    NCDHW."""
    channels_last = torch.empty_like(tensor, memory_format=torch.channels_last_3d)
    return tensor if tensor.stride() == channels_last.stride() else channels_last.copy_(tensor)


@opaque_to_tracing
def _one_channel_input_as_channels_last(x: Any) -> Any:
    """A one-channel NCDHW input with channels_last_3d's strides, a view: both layouts
    order its elements alike. A convolution writes channels-last when its input or its
    weight reads as such, and a first layer's 1x1x1 weight (C_out, 1, 1, 1, 1) has no
    channels-last strides. Anything else as it is."""
    if (not isinstance(x, Tensor) or x.dim() != 5 or x.shape[1] != 1 or not x.is_contiguous()
            or _reads_as_channels_last(x)):
        return x
    n, _, d, h, w = x.shape
    return x.view(n, d, h, w, 1).permute(0, 4, 1, 2, 3)


def _inputs_through(graph_module: torch.fx.GraphModule, function) -> None:
    """Every input of the traced model passes through ``function`` before its first use."""
    graph = graph_module.graph
    placeholders = [node for node in graph.nodes if node.op == "placeholder"]
    if not placeholders:
        return
    with graph.inserting_after(placeholders[-1]):
        for placeholder in placeholders:
            view = graph.call_function(function, (placeholder,))
            placeholder.replace_all_uses_with(view, delete_user_cb=lambda user, view=view: user is not view)
    graph_module.recompile()


def _few_channel_convs(model: nn.Module) -> list[str]:
    """Replaces each plain nn.Conv3d with fewer than 8 input and output channels (outside the fused
    blocks, whose own convolutions pad their input channels to 8) by a FewChannelConv3d holding
    its parameters; one line per replacement."""
    lines = []
    for path, conv in list(model.named_modules()):
        parent, _, name = path.rpartition(".")
        holder = model.get_submodule(parent)
        if FewChannelConv3d.takes(conv) and not type(holder).__module__.startswith("cutlassfuse."):
            setattr(holder, name, FewChannelConv3d.from_conv(conv))
            lines.append(f"{path}: {_describe_module(conv)} -> FewChannelConv3d: a direct convolution in "
                         f"float16/bfloat16 on CUDA, its {conv.in_channels} input channel(s) padded to 8 (tensor "
                         "cores) where autograd records the call")
    return lines


def _run_channels_last(model: nn.Module) -> None:
    """Puts the model's 5-D parameters and buffers (the convolutions' weights) in
    channels_last_3d, so that every convolution, fused or not, writes channels-last
    (PyTorch's rule: the output is channels-last when the input or the weight is) and
    the activations stay channels-last from the first layer on: one layout conversion at
    the input instead of one per block (and none of the weights per call). A traced
    model's one-channel inputs take channels-last strides too. Its last node (elsewhere a
    forward hook) returns NCDHW outputs for NCDHW inputs; an untraced model's 5-D arguments
    after the first enter channels-last (a forward pre-hook)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.dim() == 5:
                tensor.data = _channels_last_strides(tensor.data)
    if isinstance(model, torch.fx.GraphModule):
        _inputs_through(model, _one_channel_input_as_channels_last)
        _output_through(model, _outputs_in_layout_of)
    else:
        model.register_forward_pre_hook(_state_in_channels_last, with_kwargs=True)
        model.register_forward_hook(_outputs_in_input_layout)


def fuse(model: nn.Module, *, trace: bool = True, channels_last: bool | None = None,
         cuda_graphs: bool = False) -> FuseResult:
    """Fuses the chains of `model` that cutlassfuse's blocks compute.

    A chain is a Conv3d or ConvTranspose3d (padding_mode "zeros"), then an nn.GroupNorm
    or nn.InstanceNorm3d without running statistics, with an activation after the norm,
    before it, or none: Conv3dNormActivation, ConvTranspose3dNormActivation, and
    ConvTranspose3dReLUGroupNorm for ConvTranspose3d -> ReLU -> GroupNorm. A norm and
    its activation that no convolution takes become GroupNormActivation: a GroupNorm's
    on (N, C, *) input of any spatial rank (2-D networks' too), an InstanceNorm's where
    its input is 5-D (nn.InstanceNorm3d's, or F.instance_norm's after a 3-D layer).
    Activations: nn.ReLU, LeakyReLU, PReLU, SiLU, GELU, ELU (and in forward() code
    F.relu, torch.relu, .relu(), F.leaky_relu, F.silu, F.gelu, F.elu, F.prelu). Between
    the layers nn.Identity and dropout with p=0 are passed through (they change nothing,
    in either mode); a dropout with p > 0 randomizes in training, so no block spans
    it. The fused blocks take batched 5-D input, (N, C, D, H, W).

    In eval mode a norm with running statistics after a Conv3d or ConvTranspose3d
    (nn.BatchNorm3d, nn.InstanceNorm3d with track_running_stats=True: both then scale and
    shift each channel by fixed numbers) folds into the conv instead: a new conv of the
    same type holds the folded weight and bias (torch.nn.utils.fusion's
    fuse_conv_bn_weights, in float64), the norm becomes nn.Identity (in a trace its call
    goes), and the activation after it stays as it is. In training mode these norms use batch statistics and
    nothing folds (the result says so). Folding is for inference: the folded model has
    no norm left (train() on it trains the folded convs without one), and the folded
    convs' parameters are new objects; the model's own convs and norms are left as they
    are.

    Known library modules that compute a block no chain matches are replaced in place
    first, by modules of the same computation holding their parameters
    (library_modules.py: diffusers' Mochi per-frame GroupNorms, with the SiLU after them,
    by FrameGroupNormActivation; ``result.library_modules``).

    nn.Sequential chains are replaced in place (model keeps its type), the first layer's
    slot taking the block and the others becoming nn.Identity; a chain may run on into
    nested nn.Sequentials (MONAI's Convolution: the conv, then its ADN's norm, dropout
    and activation). With ``trace=True`` the forward code is then traced with torch.fx
    and chains written there (modules, F.group_norm and F.instance_norm, the functional
    activations) are fused too. Where the trace holds a fused block (unless the model is
    a plain nn.Sequential, whose indexing the in-place rewrite keeps) the result is the
    rewritten trace, a torch.fx.GraphModule that calls the layers themselves: the
    containers around them and the calls of nn.Identity and of dropout with p=0 go
    (modules with hooks stay calls that run them). Models
    torch.fx cannot trace, whose forward() branches on train/eval mode (a trace would
    freeze the branch taken) or asks a traced value's type (torch.jit.isinstance, which
    a trace answers wrongly; known library modules that do, MONAI's UpCat, are traced
    through a stand-in, cutlassfuse.traceable_forwards), keep the Sequential rewrite and
    the result says why; they are then fused in parts: each child's forward() code traced
    on its own (a child's children, in turn, where the child cannot be traced), each child
    whose trace calls a fused block or replaced a pad becoming that trace, then the
    model's own forward() traced with the children it could not trace kept as calls, where
    that trace holds, its own chains fused (the result names every module replaced by its
    trace). The fused blocks hold the
    original parameter objects. The result lists every chain fused (where, what, what it
    became), every norm folded (``folded``: where, what, the activation kept) and every
    candidate left alone, with the reason.

    Checkpoints move both ways: the fused model's ``state_dict()`` has the original
    model's keys (each fused block's tensors under the keys of the modules they came
    from), and its ``load_state_dict()`` takes those keys, so a state_dict saved from
    either model loads into the other with ``strict=True``. This holds for
    ``state_dict()`` and ``load_state_dict()`` called on the returned model (or a model
    holding it) and on `model`, which the Sequential rewrite changed in place;
    ``named_parameters()``, ``named_modules()`` and a fused block's own ``state_dict()``
    show the fused structure (``conv``, ``norm``, ``activation``; ``conv_transpose``,
    ``group_norm``). A module registered at two paths (which a trace keeps at one) has
    its keys under both, and the tensors of modules forward() never calls (which a
    trace drops) stay in the traced model. The keys are kept by state_dict hooks, which
    ``copy.deepcopy`` keeps; a torch.fx.GraphModule pickled whole (``torch.save(model)``)
    comes back without them, with the fused keys.

    With ``channels_last`` (and any chain fused or library module replaced) the model's
    5-D parameters and buffers (the convolutions' weights) move to channels_last_3d: every
    convolution then writes channels-last, so the activations run channels-last from the
    first layer on, one layout conversion at the input in place of one per block; the
    returned model (its
    trace's last node, or a forward hook) gives NCDHW outputs for NCDHW inputs, as the
    original model's. The
    parameters stay the same objects with the same values. ``channels_last=None`` (the
    default) chooses it where the whole forward() was traced, so that fuse() saw every op
    between the blocks; code it could not trace keeps the layouts (each block then
    converts its input and output), because PyTorch runs some ops slowly on
    channels-last tensors or returns them NCDHW (a replicate pad, a concatenation of
    mixed layouts: MONAI's BasicUNet decoder does both). ``result.channels_last`` says
    which was chosen.

    With ``cuda_graphs`` the returned model is the fused model in a ``CUDAGraphed``
    (cutlassfuse.cuda_graphs), whose inference calls (CUDA inputs, no autograd, eval mode)
    replay a CUDA graph of the fused forward per input signature instead of issuing its
    kernels one by one: for networks of small layers, whose time is the host's time to
    issue the kernels. Its state_dict keys are the fused model's.

    A folded norm's running statistics cannot be told apart from the conv's weight
    afterwards, so folded models load one way: a state_dict of the original model loads
    into the folded one (its conv and norm tensors are folded anew as it loads), and one
    of the folded model, which holds each folded conv's weight and bias under its own
    keys (in an nn.Sequential the conv's, in a trace the new module's) and none of the
    norm's, loads into a model folded the same way; the original model refuses it
    (``strict=True``: the norm's keys are missing).
    """
    original = model.state_dict(keep_vars=True)
    found = _Found()
    library_modules = replace_library_modules(model)
    _fuse_sequentials(model, "", found)
    graph_module, not_traced = None, None
    if trace:
        try:
            graph_module = torch.fx.GraphModule(model, _trace_in_either_mode(model), type(model).__name__)
        except Exception as error:  # torch.fx raises many types for untraceable code
            not_traced = f"{type(error).__name__}: {error}"
            model, traced_parts = _fuse_in_parts(model, "", found)
            if traced_parts:
                parts = ", ".join(path or "the model (what it cannot trace called as it is)" for path in traced_parts)
                not_traced += f"; the traced forward() of {parts} runs in their place"
    _keep_original_keys(model, original, found.folds)
    result = FuseResult(model, found.replaced, not_traced=not_traced, folded=found.folded,
                        residual_adds=found.residual_adds, replicate_pads=found.replicate_pads,
                        bias_adds=found.bias_adds, kernel_mode=found.kernel_mode, library_modules=library_modules)
    if graph_module is not None:
        result.model = _fuse_graph(graph_module, model, found)
        if result.model is not model:
            _keep_unused_tensors(result.model, model, found.folds)
            _keep_original_keys(result.model, original, found.folds)
    result.left_alone = [f"{path}: {reason}" for path, reason in found.notes.items()]
    result.few_channel_convs = _few_channel_convs(result.model)
    if channels_last is None:
        # Channels-last pays where fuse() sees every op between the blocks; code it could not
        # trace may run ops that are slow on channels-last tensors or mix layouts (MONAI's
        # BasicUNet pads with mode="replicate" and concatenates its skip connections there).
        channels_last = trace and not_traced is None
    result.channels_last = channels_last and bool(result.replaced or result.library_modules)
    if result.channels_last:
        _run_channels_last(result.model)
    if cuda_graphs:
        result.model = CUDAGraphed(result.model)
    return result


__all__ = ["FuseResult", "fuse"]
