"""Library modules that fuse() replaces by cutlassfuse's modules of the same computation.

Some library code computes a block in a way no trace can follow and no chain matches:
diffusers' Mochi decoder normalizes its activations frame by frame, in chunks of eight
frames that it concatenates, through a permuted copy (MochiChunkedGroupNorm3D), and its
resnet blocks apply their SiLU after each such norm; CogVideoX's decoder runs its GroupNorms
inside norms modulated by the latent (CogVideoXSpatialNorm3D), in code that branches on the
number of frames. fuse() replaces these modules in place,
wherever they sit (their callers keep their code): each by a module computing the same
values with cutlassfuse's ops, holding the very parameters.

A replacement is keyed by the module's class (its module path and qualified name, so that
the library need not be imported) and by the SHA-256 digest of the source of the forward()
it reproduces, as traceable_forwards' stand-ins are: a library release whose forward()
reads otherwise keeps its module.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .block_modules import FrameGroupNormActivation, GroupNormActivation
from .traceable_forwards import entry_for_forward


def _frame_norm(norm: nn.Module, activation: nn.Module) -> FrameGroupNormActivation:
    """MochiChunkedGroupNorm3D (its nn.GroupNorm ``norm_layer`` applied to each frame),
    then ``activation``, as one FrameGroupNormActivation."""
    return FrameGroupNormActivation(GroupNormActivation.from_modules(norm.norm_layer, activation))


def _cogvideox_spatial_norm(module: nn.Module) -> tuple[nn.Module, str]:
    """CogVideoXSpatialNorm3D, whose forward() calls its ``norm_layer`` (an nn.GroupNorm)
    on the features and nowhere else: the GroupNorm as a GroupNormActivation without an
    activation; the modulation by the latent after it stays the module's code."""
    module.norm_layer = GroupNormActivation.from_modules(module.norm_layer, nn.Identity())
    return module, "GroupNorm -> GroupNormActivation (the latent's modulation after it as it is)"


def _mochi_norm(module: nn.Module) -> tuple[nn.Module, str]:
    return _frame_norm(module, nn.Identity()), "GroupNorm per frame -> FrameGroupNormActivation"


def _mochi_resnet(module: nn.Module) -> tuple[nn.Module, str]:
    """MochiResnetBlock3D, whose forward() applies its ``nonlinearity`` after each of its
    two norms and nowhere else: both norms with the activation, the nonlinearity then an
    nn.Identity."""
    activation = module.nonlinearity
    module.norm1 = _frame_norm(module.norm1, activation)
    module.norm2 = _frame_norm(module.norm2, activation)
    module.nonlinearity = nn.Identity()
    return module, f"GroupNorm per frame + {type(activation).__name__}, twice -> FrameGroupNormActivation"


_DIFFUSERS_COGVIDEOX = "diffusers.models.autoencoders.autoencoder_kl_cogvideox"
_DIFFUSERS_MOCHI = "diffusers.models.autoencoders.autoencoder_kl_mochi"
# (class module, class name) -> (replacement, digest of the forward() source it reproduces).
# The resnet comes first: it replaces its norms with their activation.
_REPLACEMENTS: dict[tuple[str, str], tuple[Callable[[nn.Module], tuple[nn.Module, str]], str]] = {
    # MochiResnetBlock3D.forward and MochiChunkedGroupNorm3D.forward as diffusers 0.42.1 writes them.
    (_DIFFUSERS_MOCHI, "MochiResnetBlock3D"):
        (_mochi_resnet, "d0855d30bbbce63ff5dccc8a5c7232e6379d298b90b2434da517f60ebf62d1cf"),
    (_DIFFUSERS_MOCHI, "MochiChunkedGroupNorm3D"):
        (_mochi_norm, "765ff3f4a4c02dc43a31115a31776af63490040acdab4eaa7863ad248daa43c3"),
    # CogVideoXSpatialNorm3D.forward as diffusers 0.42.1 writes it.
    (_DIFFUSERS_COGVIDEOX, "CogVideoXSpatialNorm3D"):
        (_cogvideox_spatial_norm, "d1c450ffaca13947d7fbb3f2ed2a8e9a3d292bdffc4c6dd4993d18bda1491fbe"),
}


def replace_library_modules(model: nn.Module) -> list[str]:
    """Replaces, in place, each known library module under ``model`` (not ``model``
    itself) by its cutlassfuse module; one report line per replacement: where, what."""
    lines = []
    for path, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            replace = entry_for_forward(_REPLACEMENTS, child)
            if replace is None:
                continue
            where = f"{path}.{name}" if path else name
            replaced, what = replace(child)
            setattr(parent, name, replaced)
            lines.append(f"{where}: {type(child).__name__}: {what}")
    return lines
