"""`cutlassfuse.fuse(model)`: replace ConvTranspose3d -> ReLU -> GroupNorm chains in an
existing model by ConvTranspose3dReLUGroupNorm, keeping the very same parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .modules import ConvTranspose3dReLUGroupNorm

_RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_)


@dataclass
class FuseResult:
    model: nn.Module
    replaced: list[str] = field(default_factory=list)  # one line per fused chain
    not_traced: str | None = None  # why the torch.fx pass could not run, if it could not

    def __str__(self) -> str:
        lines = [f"cutlassfuse.fuse: {len(self.replaced)} chain(s) fused"] + [f"  {r}" for r in self.replaced]
        if self.not_traced:
            lines.append(f"  (forward() not traced: {self.not_traced})")
        return "\n".join(lines)


def _fusable(conv: nn.Module, relu: nn.Module | None, norm: nn.Module) -> bool:
    return (type(conv) is nn.ConvTranspose3d and conv.padding_mode == "zeros" and type(norm) is nn.GroupNorm
            and norm.num_channels == conv.out_channels and (relu is None or type(relu) is nn.ReLU))


def _describe(where: str, conv: nn.ConvTranspose3d, norm: nn.GroupNorm) -> str:
    return (f"{where}: ConvTranspose3d({conv.in_channels}->{conv.out_channels}, kernel={conv.kernel_size}, "
            f"stride={conv.stride}) + ReLU + GroupNorm({norm.num_groups}) -> ConvTranspose3dReLUGroupNorm")


def _original_keys(fused: str, conv: tuple[str, nn.Module], norm: tuple[str, nn.Module]) -> dict[str, str]:
    """The state_dict keys of the fused block at path `fused`, each with the key its
    tensor had in the original model, where the conv and the norm sat at their paths."""
    keys = {}
    for child, (path, module) in (("conv_transpose", conv), ("group_norm", norm)):
        for name in module.state_dict(keep_vars=True):
            keys[f"{fused}.{child}.{name}"] = f"{path}.{name}"
    return keys


def _fuse_sequentials(module: nn.Module, prefix: str, replaced: list[str], keys: dict[str, str]) -> None:
    """In every nn.Sequential: the conv's slot takes the fused block, ReLU's and
    GroupNorm's become nn.Identity, so the indices of the layers after them do not move."""
    for name, child in module.named_children():
        _fuse_sequentials(child, f"{prefix}{name}.", replaced, keys)
    if not isinstance(module, nn.Sequential):
        return
    names = list(module._modules)
    i = 0
    while i + 2 < len(names):
        conv, relu, norm = (module._modules[k] for k in names[i:i + 3])
        if _fusable(conv, relu, norm):
            module._modules[names[i]] = ConvTranspose3dReLUGroupNorm.from_modules(conv, norm)
            module._modules[names[i + 1]] = nn.Identity().train(relu.training)
            module._modules[names[i + 2]] = nn.Identity().train(norm.training)
            replaced.append(_describe(f"{prefix}{names[i]}", conv, norm))
            keys.update(_original_keys(f"{prefix}{names[i]}", (f"{prefix}{names[i]}", conv),
                                       (f"{prefix}{names[i + 2]}", norm)))
            i += 3
        else:
            i += 1


def _is_relu(node: torch.fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return type(modules[node.target]) is nn.ReLU
    if node.op == "call_function":
        return node.target in _RELU_FUNCTIONS
    return node.op == "call_method" and node.target in ("relu", "relu_")


class _Tracer(torch.fx.Tracer):
    """Keeps already fused blocks (from the Sequential pass) opaque."""

    def is_leaf_module(self, module: nn.Module, qualified_name: str) -> bool:
        return isinstance(module, ConvTranspose3dReLUGroupNorm) or super().is_leaf_module(module, qualified_name)


def _single_user(node: torch.fx.Node) -> torch.fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _unused_name(module: nn.Module, name: str) -> str:
    candidate, n = name, 1
    while hasattr(module, candidate):
        candidate, n = f"{name}_{n}", n + 1
    return candidate


def _conv_call_arguments(node: torch.fx.Node) -> tuple[tuple, dict] | None:
    """The conv call's (input, output_size) as the fused block takes them, or None for a
    call that passes anything else (the block would not see it)."""
    bound = dict(zip(("input", "output_size"), node.args, strict=False))
    if len(node.args) > 2 or bound.keys() & node.kwargs.keys() or not node.kwargs.keys() <= {"input", "output_size"}:
        return None
    bound.update(node.kwargs)
    if "input" not in bound:
        return None
    output_size = bound.get("output_size")
    return (bound["input"],), ({} if output_size is None else {"output_size": output_size})


class _ModeDependentForward(Exception):
    pass


def _trace_in_either_mode(model: nn.Module) -> torch.fx.Graph:
    """A torch.fx trace of forward() that holds in train and eval mode alike. Tracing
    runs forward() once, so a branch on `self.training` would be frozen as traced and
    the rewritten model would ignore later train()/eval() calls there: such models are
    traced in both modes and refused when the graphs differ. Every module's own flag is
    restored afterwards (a model may hold eval-mode parts while training)."""
    flags = {module: module.training for module in model.modules()}
    try:
        graphs = [_Tracer().trace(model.train(mode)) for mode in (model.training, not model.training)]
    finally:
        for module, flag in flags.items():
            module.training = flag
    if str(graphs[0]) != str(graphs[1]):
        raise _ModeDependentForward("forward() takes different paths in train and eval mode (self.training), "
                                    "which a trace would freeze")
    return graphs[0]


def _fuse_graph(model: nn.Module, replaced: list[str], keys: dict[str, str]) -> nn.Module:
    """The same rewrite in a torch.fx trace of forward(), for chains written in code:
    conv module (called with its input and optionally output_size) -> ReLU (module,
    F.relu, torch.relu, .relu()) -> GroupNorm module, each intermediate used once."""
    graph_module = torch.fx.GraphModule(model, _trace_in_either_mode(model), type(model).__name__)
    modules = dict(graph_module.named_modules())
    fused_any = False
    for node in list(graph_module.graph.nodes):
        if node.op != "call_module" or type(modules.get(node.target)) is not nn.ConvTranspose3d:
            continue
        relu = _single_user(node)
        norm = _single_user(relu) if relu is not None and _is_relu(relu, modules) else None
        if norm is None or norm.op != "call_module" or not _fusable(modules[node.target], None, modules[norm.target]):
            continue
        conv_call = _conv_call_arguments(node)
        if conv_call is None:
            continue
        conv_module, norm_module = modules[node.target], modules[norm.target]
        # Named after both modules: one conv can feed chains ending in different norms.
        name = _unused_name(graph_module, f"{node.target}_relu_{norm.target}".replace(".", "_"))
        graph_module.add_submodule(name, ConvTranspose3dReLUGroupNorm.from_modules(conv_module, norm_module))
        with graph_module.graph.inserting_after(norm):
            fused = graph_module.graph.call_module(name, *conv_call)
        norm.replace_all_uses_with(fused)
        for dead in (norm, relu, node):
            graph_module.graph.erase_node(dead)
        replaced.append(_describe(node.target, conv_module, norm_module))
        keys.update(_original_keys(name, (node.target, conv_module), (norm.target, norm_module)))
        fused_any = True
    if not fused_any:
        return model
    graph_module.graph.lint()
    graph_module.delete_all_unused_submodules()
    graph_module.recompile()
    return graph_module


@dataclass
class _SaveOriginalKeys:
    """state_dict post-hook: the fused blocks' tensors under their original keys."""

    original: dict[str, str]  # fused key -> original key, relative to the hooked module

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        if not any(prefix + key in state_dict for key in self.original):
            return
        # Renamed in place, so that the keys keep their order (the original model's, for a
        # Sequential). A key the model also holds under its original name (a conv it still
        # calls elsewhere) is there once.
        section = [(key, state_dict.pop(key)) for key in list(state_dict) if key.startswith(prefix)]
        for key, value in section:
            relative = key[len(prefix):]
            state_dict.setdefault(prefix + self.original.get(relative, relative), value)


@dataclass
class _LoadOriginalKeys:
    """load_state_dict pre-hook: a state_dict with the original keys loads into the fused
    blocks (one with their own keys still loads as it is)."""

    fused: dict[str, list[str]]  # original key -> fused keys (a conv feeding two chains has two)

    def __call__(self, module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
        for original, fused_keys in self.fused.items():
            if prefix + original in state_dict:
                for fused in fused_keys:
                    state_dict.setdefault(prefix + fused, state_dict[prefix + original])
                if not _holds(module, original):
                    del state_dict[prefix + original]


def _holds(module: nn.Module, key: str) -> bool:
    """Whether `module` still has a tensor at `key` itself (the original conv, where the
    model calls it elsewhere too)."""
    path, _, name = key.rpartition(".")
    try:
        owner = module.get_submodule(path)
    except AttributeError:
        return False
    return isinstance(getattr(owner, name, None), torch.Tensor)


def _keep_original_keys(model: nn.Module, keys: dict[str, str]) -> None:
    """Hooks `model`'s state_dict() and load_state_dict() to the original keys (`keys`:
    fused key -> original key)."""
    if not keys:
        return
    fused: dict[str, list[str]] = {}
    for fused_key, original in keys.items():
        fused.setdefault(original, []).append(fused_key)
    model.register_state_dict_post_hook(_SaveOriginalKeys(dict(keys)))
    model.register_load_state_dict_pre_hook(_LoadOriginalKeys(fused))


def fuse(model: nn.Module, *, trace: bool = True) -> FuseResult:
    """Fuses every ConvTranspose3d -> ReLU -> GroupNorm chain of `model`.

    nn.Sequential chains are replaced in place (model keeps its type). With
    ``trace=True`` the forward code is then traced with torch.fx and chains written
    there are fused too; the result is then a torch.fx.GraphModule. Models torch.fx
    cannot trace, or whose forward() branches on train/eval mode (a trace would freeze
    the branch taken), keep the Sequential rewrite, and the result says why. The fused
    blocks hold the original parameter objects.

    Checkpoints move both ways: the fused model's ``state_dict()`` has the original
    model's keys (each fused block's ``conv_transpose.*`` and ``group_norm.*`` tensors
    under the keys of the ConvTranspose3d and the GroupNorm they came from), and its
    ``load_state_dict()`` takes those keys, so a state_dict saved from either model loads
    into the other with ``strict=True``. This holds for ``state_dict()`` and
    ``load_state_dict()`` called on the returned model (or a model holding it) and on
    `model`, which the Sequential rewrite changed in place; ``named_parameters()``,
    ``named_modules()`` and a fused block's own ``state_dict()`` show the fused
    structure (``conv_transpose``, ``group_norm``). The keys are kept by state_dict
    hooks, which ``copy.deepcopy`` keeps; a torch.fx.GraphModule pickled whole
    (``torch.save(model)``) comes back without them, with the fused keys.
    """
    replaced: list[str] = []
    sequential_keys: dict[str, str] = {}
    _fuse_sequentials(model, "", replaced, sequential_keys)
    _keep_original_keys(model, sequential_keys)
    result = FuseResult(model, replaced)
    if trace:
        graph_keys = dict(sequential_keys)  # the Sequential chains keep their paths in the trace
        try:
            result.model = _fuse_graph(model, replaced, graph_keys)
        except Exception as error:  # torch.fx raises many types for untraceable code
            result.not_traced = f"{type(error).__name__}: {error}"
        if result.model is not model:
            _keep_original_keys(result.model, graph_keys)
    return result


__all__ = ["FuseResult", "fuse"]
