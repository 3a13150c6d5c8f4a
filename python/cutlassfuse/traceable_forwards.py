"""Stand-ins that torch.fx can trace for library forward() code it cannot follow.

fuse() traces a model's forward() to find the blocks written in code and to run the
activations channels-last between them. A forward() that asks the type or the sizes of a
traced value in Python control flow stops the trace of the whole model. Where such code is
a known library module, the tracer traces its stand-in here instead: the same computation,
with the value-dependent part in one function that the trace calls as a whole (a
``call_function`` node), so that it runs on the real tensors on every call.

A stand-in is keyed by the module's class (its module path and qualified name, so that
the library need not be imported) and by the SHA-256 digest of the source of the forward()
it was written against: a library release whose forward() reads otherwise gets no
stand-in, and its model is traced in parts as any other that no trace can follow.
It takes the module and its forward()'s arguments.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import Tensor, nn

from .upsample_nearest import CAUSAL_UPSAMPLE_NEAREST3D


def opaque_to_tracing(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (positional arguments), recorded by a torch.fx trace as one call of
    itself instead of traced through: its Python branches ask the types and sizes of real
    tensors, which a traced value cannot answer. Any tracer: fuse()'s, and the one that
    rebuilds a pickled GraphModule from its code as it loads, which would otherwise bake
    the branch a traced value takes into the graph."""

    @functools.wraps(function)
    def call(*args: Any) -> Any:
        for arg in args:
            if isinstance(arg, torch.fx.Proxy):
                return arg.tracer.create_proxy("call_function", call, args, {})
        return function(*args)

    return call


@opaque_to_tracing
def skip_concatenation(upsampled: Tensor, skip: Any, pad_to_skip: bool) -> Tensor:
    """MONAI UpCat's merge of the upsampled features with the encoder's skip features,
    as its forward() computes it: with a tensor ``skip``, the upsampled features padded by
    one replicated voxel at the end of each spatial dimension whose size differs from the
    skip's (``is_pad``: odd sizes halved by max pooling), then ``cat([skip, upsampled])``
    along the channels; without one, the upsampled features alone. A padding of zero
    voxels is skipped, not run as a copy: same values, and no copy that PyTorch makes
    NCDHW for channels-last input."""
    if not isinstance(skip, Tensor):
        return upsampled
    if pad_to_skip:
        dimensions = upsampled.dim() - 2
        padding = [0] * (dimensions * 2)
        for i in range(dimensions):
            if skip.shape[-i - 1] != upsampled.shape[-i - 1]:
                padding[i * 2 + 1] = 1
        if any(padding):
            upsampled = F.pad(upsampled, padding, "replicate")
    return torch.cat([skip, upsampled], dim=1)


def _upcat_forward(module: nn.Module, x: Any, x_e: Any) -> Any:
    """monai.networks.nets.basic_unet.UpCat.forward(x, x_e): its type check of ``x_e``
    (torch.jit.isinstance) and its size comparisons run inside ``skip_concatenation``."""
    return module.convs(skip_concatenation(module.upsample(x), x_e, bool(module.is_pad)))


def causal_nearest_upsample(hidden_states: Tensor, factors: tuple[int, int, int]) -> Tensor:
    """diffusers' HunyuanVideoUpsampleCausal3D upsampling by nearest neighbours: the first
    frame in space only, the frames after it in time and space (``factors``: D, H, W), as
    one op (``torch.ops.cutlassfuse.causal_upsample_nearest3d``: one gather on CUDA, no
    copy of the later frames and no concatenation), which takes the branch on whether there
    are frames after the first that a trace cannot. diffusers makes the later frames
    NCDHW-contiguous first, against an old PyTorch bug in interpolating non-contiguous
    input; the op keeps the input's layout, so channels-last activations stay channels-last
    (the NCDHW copy and the concatenation of mixed layouts cost a channels-last decoder two
    transposing copies of its largest activations). The same values."""
    return CAUSAL_UPSAMPLE_NEAREST3D(hidden_states, [float(f) for f in factors])


def _hunyuan_video_upsample_forward(module: nn.Module, hidden_states: Any) -> Any:
    """diffusers.models.autoencoders.autoencoder_kl_hunyuan_video.HunyuanVideoUpsampleCausal3D
    .forward(hidden_states): its upsampling in ``causal_nearest_upsample``, its causal
    convolution traced."""
    return module.conv(causal_nearest_upsample(hidden_states, tuple(module.upsample_factor)))


# (class module, class name) -> (stand-in, digest of the forward() source it reproduces).
_STAND_INS: dict[tuple[str, str], tuple[Callable[..., Any], str]] = {
    # UpCat.forward as MONAI 1.6.1 writes it.
    ("monai.networks.nets.basic_unet", "UpCat"):
        (_upcat_forward, "ef51ccbbcdc706e8dde1fc8492985c749e3323ccb7fec73fe2fd56c692723407"),
    # HunyuanVideoUpsampleCausal3D.forward as diffusers 0.42.1 writes it.
    ("diffusers.models.autoencoders.autoencoder_kl_hunyuan_video", "HunyuanVideoUpsampleCausal3D"):
        (_hunyuan_video_upsample_forward, "1a034fe4c3b920df40cb2a6992f2593c17ed9764121a41de025e2bd98e569b14"),
}


@functools.cache
def source_digest(forward: Callable[..., Any]) -> str | None:
    """The SHA-256 digest of ``forward``'s source, None where it has none."""
    try:
        return hashlib.sha256(inspect.getsource(forward).encode()).hexdigest()
    except (OSError, TypeError):  # no source to read (a compiled or generated class)
        return None


def entry_for_forward(table: dict[tuple[str, str], tuple[Any, str]], module: nn.Module) -> Any:
    """The entry of ``table`` ((class module, class name) -> (entry, digest of the forward()
    source it was written against)) for ``module``'s class, None where there is none or
    the class's forward() reads otherwise."""
    cls = type(module)
    entry = table.get((cls.__module__, cls.__qualname__))
    if entry is None:
        return None
    value, digest = entry
    return value if source_digest(cls.forward) == digest else None


def stand_in(module: nn.Module) -> Callable[..., Any] | None:
    """The traceable stand-in for ``module``'s forward() (called with the module and the
    forward's arguments), or None where its own forward() is traced: a
    class without one, or whose forward() is not the code the stand-in reproduces."""
    return entry_for_forward(_STAND_INS, module)
