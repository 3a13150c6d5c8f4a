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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block_modules import FrameGroupNormActivation, GroupNormActivation
from .blocks import activation_of_module
from .bias_add import conv3d_bias_add
from .channel_rms_norm import CHANNEL_RMS_NORM
from .traceable_forwards import entry_for_forward, source_digest
from .upsampled_modulation import UPSAMPLED_MODULATION


def _frame_norm(norm: nn.Module, activation: nn.Module) -> FrameGroupNormActivation:
    """MochiChunkedGroupNorm3D (its nn.GroupNorm ``norm_layer`` applied to each frame),
    then ``activation``, as one FrameGroupNormActivation."""
    return FrameGroupNormActivation(GroupNormActivation.from_modules(norm.norm_layer, activation))


_CL = torch.channels_last_3d


def _power_of_two_factor(small: int, large: int) -> int | None:
    """``large // small`` where it is a power of two (then nearest upsampling from
    ``small`` to ``large`` repeats each element that many times exactly: ATen's source index
    floor(i * small / large) has no rounding), else None."""
    if small <= 0 or large < small or large % small:
        return None
    factor = large // small
    return factor if factor & (factor - 1) == 0 else None


def _frame_parts(causal_frames: bool) -> list[slice]:
    """The ranges of frames upsampled apart: the first and the later ones with causal
    frames, else all together."""
    return [slice(0, 1), slice(1, None)] if causal_frames else [slice(None)]


def _broadcast_shapes(like: Tensor, small: Tensor) -> tuple[list[int], list[int]] | None:
    """Shapes that make nearest upsampling of ``small`` to ``like``'s size a broadcast:
    ``like`` viewed as (N, C, t, ft, h, fh, w, fw) against ``small`` as (N, C, t, 1, h, 1,
    w, 1); None unless every factor f is a power of two."""
    factors = [_power_of_two_factor(s, n) for s, n in zip(small.shape[2:], like.shape[2:], strict=True)]
    if None in factors:
        return None
    split, spread = [*like.shape[:2]], [*small.shape[:2]]
    for size, factor in zip(small.shape[2:], factors, strict=True):
        split += [size, factor]
        spread += [size, 1]
    return split, spread


class _BroadcastModulation(torch.autograd.Function):
    """``upsampled_modulation(norm, scale, shift, causal_frames)`` with the upsampling a
    broadcast (every part's factors powers of two): one addcmul per part of frames, each
    written into its frames of the output, nothing else of the full size written, one
    rounding (ATen's opmath). The gradients are the op's, recomputed in the backward
    (differentiable again)."""

    @staticmethod
    def forward(ctx, norm: Tensor, scale: Tensor, shift: Tensor, causal_frames: bool) -> Tensor:
        out = torch.empty_like(norm)
        for p in _frame_parts(causal_frames):
            split, spread = _broadcast_shapes(norm[:, :, p], scale[:, :, p])
            torch.addcmul(shift[:, :, p].reshape(spread), norm[:, :, p].view(split), scale[:, :, p].reshape(spread),
                          out=out[:, :, p].view(split))
        ctx.causal_frames = causal_frames
        ctx.save_for_backward(norm, scale, shift)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        inputs = ctx.saved_tensors
        wanted = [t for t, needed in zip(inputs, ctx.needs_input_grad[:3], strict=True) if needed]
        with torch.enable_grad():
            out = UPSAMPLED_MODULATION(*inputs, ctx.causal_frames)
        grads = iter(torch.autograd.grad(out, wanted, grad, create_graph=torch.is_grad_enabled()))
        return (*(next(grads) if needed else None for needed in ctx.needs_input_grad[:3]), None)


def _modulate(norm: Tensor, scale: Tensor, shift: Tensor, causal_frames: bool) -> Tensor:
    """``upsampled_modulation(norm, scale, shift, causal_frames)`` off its pass's scope: a
    broadcast where every factor is a power of two, else the op's ATen ops (the upsampled
    tensors written out)."""
    if all(_broadcast_shapes(norm[:, :, p], scale[:, :, p]) is not None for p in _frame_parts(causal_frames)):
        return _BroadcastModulation.apply(norm, scale, shift, causal_frames)
    return UPSAMPLED_MODULATION(norm, scale, shift, causal_frames)


class FusedCogVideoXSpatialNorm3D(nn.Module):
    """diffusers' CogVideoXSpatialNorm3D, then ``activation``: ``act(group_norm(f) *
    conv_y(zq') + conv_b(zq'))``, ``zq'`` the latent ``zq`` nearest-upsampled to ``f``'s
    frames and pixels (f's first frame from zq's first, the others from zq's others where f
    has an odd number of frames above one), ``conv_y`` and ``conv_b`` 1x1x1 causal
    convolutions.

    The convolutions run at the latent's resolution: a 1x1x1 convolution and a nearest
    upsampling commute (both act on each pixel alone), so the upsampled latent and the two
    full-size convolution outputs (and the library's copies of the upsampled latent, as the
    1x1x1 convolutions' frame caches, which nothing reads) are never written. The GroupNorm
    runs on ``group_norm_activation``. The modulation and the activation: on channels-last
    CUDA activations, ``upsampled_modulation``'s one pass reading the small tensors;
    otherwise one addcmul reading them through broadcast views (``_modulate``), then the
    activation. The output has ``f``'s layout; the convolutions' frame caches returned are
    None (a 1x1x1 causal convolution reads no earlier frames). The submodules are the
    original's, with the same parameter names.
    """

    def __init__(self, module: nn.Module, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.norm_layer = GroupNormActivation.from_modules(module.norm_layer, nn.Identity())
        self.conv_y, self.conv_b = module.conv_y, module.conv_b
        self.activation = activation if activation is not None else nn.Identity()
        name, parameter, _ = activation_of_module(self.activation)  # ValueError for others
        if name == "prelu":
            raise ValueError("cutlassfuse: the upsampled modulation takes no PReLU")
        self._activation_arguments = (name, parameter)

    @staticmethod
    def takes(module: nn.Module) -> bool:
        """Whether ``module``'s conv_y and conv_b are 1x1x1 causal convolutions of stride 1
        without padding, as CogVideoX builds them (their frame cache then unread)."""
        return all(conv.time_kernel_size == 1 and conv.pad_mode == "constant"
                   and conv.conv.kernel_size == (1, 1, 1) and conv.conv.stride == (1, 1, 1)
                   and conv.conv.padding == (0, 0, 0) and conv.conv.groups == 1
                   for conv in (module.conv_y, module.conv_b))

    def forward(self, f: Tensor, zq: Tensor, conv_cache: dict | None = None) -> tuple[Tensor, dict]:
        norm = self.norm_layer(f)
        scale = F.conv3d(zq, self.conv_y.conv.weight, self.conv_y.conv.bias)
        shift = F.conv3d(zq, self.conv_b.conv.weight, self.conv_b.conv.bias)
        # The type norm_f * conv_y + conv_b promotes to (a float32 norm under autocast).
        dtype = torch.promote_types(norm.dtype, scale.dtype)
        norm, scale, shift = norm.to(dtype), scale.to(dtype), shift.to(dtype)
        frames = f.shape[2]
        # The library upsamples the first frame apart from the others where f has an odd
        # number of frames above one.
        causal = frames > 1 and frames % 2 == 1
        if norm.is_cuda and norm.is_contiguous(memory_format=_CL):
            out = UPSAMPLED_MODULATION(norm, scale.contiguous(memory_format=_CL), shift.contiguous(memory_format=_CL),
                                       causal, *self._activation_arguments)
        else:
            out = self.activation(_modulate(norm, scale, shift, causal))
        return out, {"conv_y": None, "conv_b": None}


class FusedCogVideoXCausalConv3d(nn.Module):
    """diffusers' CogVideoXCausalConv3d with zero padding in space: a 3-D convolution whose
    input is extended in time by the frames the previous call handed on (``conv_cache``)
    or, on a first call, by copies of its first frame; it hands on its input's last
    ``time_kernel_size - 1`` frames.

    The convolution's bias goes to ``bias_add`` where the library's CogVideoXSafeConv3d
    runs one convolution (inputs under its 2 GiB split): ATen adds it after cuDNN's
    convolution in a broadcasting pass at about half of memory bandwidth, slower still on
    channels-last tensors. A 1x1x1 convolution hands on None (the library copies its whole
    input, which no call reads). ``conv`` is the original's, with the same parameter names.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.conv = module.conv
        self.time_kernel_size = module.time_kernel_size

    @staticmethod
    def takes(module: nn.Module) -> bool:
        """Whether ``module`` pads with zeros in space (any pad_mode but "replicate":
        CogVideoX's; Mochi's replicate pads stay traceable) and extends its input in time as
        the code this module reproduces."""
        conv = module.conv
        return (module.pad_mode != "replicate" and conv.padding_mode == "zeros" and isinstance(conv.padding, tuple)
                and source_digest(type(module).fake_context_parallel_forward) == _COGVIDEOX_TIME_PADDING)

    def forward(self, inputs: Tensor, conv_cache: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        frames = self.time_kernel_size - 1
        cache = None
        if frames > 0:
            earlier = [conv_cache] if conv_cache is not None else [inputs[:, :, :1]] * frames
            inputs = torch.cat([*earlier, inputs], dim=2)
            cache = inputs[:, :, -frames:].clone()
        return self._convolution(inputs), cache

    def _convolution(self, x: Tensor) -> Tensor:
        conv = self.conv
        # The library splits inputs of over 2^30 elements in time (its "2 GB" of 16-bit ones).
        if conv.bias is None or x.numel() > 1024**3:
            return conv(x)
        return conv3d_bias_add(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)


class FusedWanRMSNorm(nn.Module):
    """diffusers' WanRMS_norm over channels (``F.normalize(x, dim=1) * sqrt(C) * gamma +
    bias``), then ``activation``, as one ``channel_rms_norm`` call: ``x / max(rms(x),
    1e-12 / sqrt(C)) * gamma + bias``, the same value (F.normalize's eps over sqrt(C)),
    computed in float32 and rounded once where the library rounds the normalized values,
    their scaling and the affine's each, and the activation a pass of its own. The output
    has the type the library's expression promotes to (its input's, for a model in one
    type). ``gamma`` and ``bias`` are the original's parameters (bias the float 0 where it
    has none)."""

    def __init__(self, module: nn.Module, activation: nn.Module | None = None) -> None:
        super().__init__()
        self.gamma = module.gamma
        self.bias = module.bias
        self.eps = 1e-12 / module.scale
        name, parameter, _ = activation_of_module(activation if activation is not None else nn.Identity())
        if name == "prelu":
            raise ValueError("cutlassfuse: channel_rms_norm takes no PReLU")
        self._activation_arguments = (name, parameter)

    @staticmethod
    def takes(module: nn.Module) -> bool:
        """Whether ``module`` normalizes over dimension 1 with the scale sqrt(C) its
        constructor sets."""
        channels = module.gamma.shape[0]
        return (module.channel_first and module.gamma.numel() == channels and module.scale == channels**0.5
                and (isinstance(module.bias, Tensor) and module.bias.numel() == channels or module.bias == 0.0))

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias.view(-1) if isinstance(self.bias, Tensor) else None
        dtype = x.dtype if bias is None else torch.promote_types(x.dtype, bias.dtype)
        x = x.to(torch.promote_types(dtype, self.gamma.dtype))
        return CHANNEL_RMS_NORM(x, self.gamma.view(-1), bias, self.eps, True, *self._activation_arguments)


class FusedWanCausalConv3d(nn.Module):
    """diffusers' WanCausalConv3d: a 3-D convolution whose input is extended in time by
    the frames the caller hands it (``cache_x``) and zero frames for the rest of its
    causal padding, and zero-padded in space. The library pads with F.pad (a copy of the
    whole input) after concatenating the cached frames (another); here the convolution pads
    in space itself, and one concatenation adds the earlier frames. The bias goes to
    ``bias_add`` (conv3d_bias_add). ``weight`` and ``bias`` are the original's."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.weight, self.bias = module.weight, module.bias
        self.stride, self.dilation, self.groups = module.stride, module.dilation, module.groups
        pad_w, _, pad_h, _, self.time_padding, _ = module._padding
        self.padding = (0, pad_h, pad_w)

    @staticmethod
    def takes(module: nn.Module) -> bool:
        """Whether ``module`` pads as the library's constructor sets it: zeros, symmetric in
        space, causal in time, none left to the convolution."""
        padding = getattr(module, "_padding", None)
        return (isinstance(module, nn.Conv3d) and module.padding_mode == "zeros" and module.padding == (0, 0, 0)
                and isinstance(padding, tuple) and len(padding) == 6 and padding[0] == padding[1]
                and padding[2] == padding[3] and padding[5] == 0)

    def forward(self, x: Tensor, cache_x: Tensor | None = None) -> Tensor:
        time_padding = self.time_padding
        earlier = []
        if cache_x is not None and time_padding > 0:
            earlier = [cache_x.to(x.device)]
            time_padding -= cache_x.shape[2]
        if time_padding > 0:
            layout = _CL if x.is_contiguous(memory_format=_CL) and not x.is_contiguous() else torch.contiguous_format
            zeros = torch.empty((x.shape[0], x.shape[1], time_padding, *x.shape[3:]), dtype=x.dtype, device=x.device,
                                memory_format=layout)
            earlier.insert(0, zeros.zero_())
        elif time_padding < 0:  # F.pad's negative padding: the first frames dropped
            earlier[0] = earlier[0][:, :, -time_padding:]
        if earlier:
            x = torch.cat([*earlier, x], dim=2)
        if self.bias is None:
            return F.conv3d(x, self.weight, None, self.stride, self.padding, self.dilation, self.groups)
        return conv3d_bias_add(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


def _cogvideox_causal_conv(module: nn.Module) -> tuple[nn.Module, str] | None:
    if not FusedCogVideoXCausalConv3d.takes(module):
        return None
    return FusedCogVideoXCausalConv3d(module), "the convolution's bias on bias_add"


def _cogvideox_spatial_norm(module: nn.Module) -> tuple[nn.Module, str]:
    """CogVideoXSpatialNorm3D as FusedCogVideoXSpatialNorm3D where its convolutions are the
    1x1x1 ones it builds; otherwise only its ``norm_layer`` (an nn.GroupNorm, which its
    forward() calls on the features and nowhere else) as a GroupNormActivation without an
    activation."""
    if FusedCogVideoXSpatialNorm3D.takes(module):
        return (FusedCogVideoXSpatialNorm3D(module),
                "GroupNorm -> GroupNormActivation; the latent's 1x1x1 convolutions at its resolution, "
                "the modulation one pass (upsampled_modulation; broadcast addcmul off channels-last CUDA)")
    module.norm_layer = GroupNormActivation.from_modules(module.norm_layer, nn.Identity())
    return module, "GroupNorm -> GroupNormActivation (the latent's modulation after it as it is)"


def _cogvideox_resnet(module: nn.Module) -> tuple[nn.Module, str] | None:
    """CogVideoXResnetBlock3D, whose forward() applies its ``nonlinearity`` after each of its
    two norms and, given a time embedding, before its ``temb_proj``: without a temb_proj
    (a decoder's, built without time-embedding channels) and with both norms spatial norms
    FusedCogVideoXSpatialNorm3D takes, both norms with the activation, the nonlinearity then
    an nn.Identity. None otherwise (its norms are then replaced on their own)."""
    norms = (module.norm1, module.norm2)
    if getattr(module, "temb_proj", None) is not None or not all(
            entry_for_forward(_REPLACEMENTS, norm) is _cogvideox_spatial_norm
            and FusedCogVideoXSpatialNorm3D.takes(norm) for norm in norms):
        return None
    activation = module.nonlinearity
    try:
        module.norm1, module.norm2 = (FusedCogVideoXSpatialNorm3D(norm, activation) for norm in norms)
    except ValueError:  # an activation the op does not compute
        return None
    module.nonlinearity = nn.Identity()
    return module, (f"CogVideoXSpatialNorm3D + {type(activation).__name__}, twice -> FusedCogVideoXSpatialNorm3D "
                    "(the modulation with the activation)")


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


def _wan_norm(module: nn.Module) -> tuple[nn.Module, str] | None:
    if not FusedWanRMSNorm.takes(module):
        return None
    return FusedWanRMSNorm(module), "F.normalize * sqrt(C) * gamma -> channel_rms_norm"


def _wan_causal_conv(module: nn.Module) -> tuple[nn.Module, str] | None:
    if not FusedWanCausalConv3d.takes(module):
        return None
    return FusedWanCausalConv3d(module), "F.pad in space -> the convolution's padding; the bias on bias_add"


def _wan_resnet(module: nn.Module) -> tuple[nn.Module, str] | None:
    """WanResidualBlock, whose forward() applies its ``nonlinearity`` after each of its two
    norms and nowhere else: both norms with the activation, the nonlinearity then an
    nn.Identity. None where a norm is not one FusedWanRMSNorm takes (its norms are then
    replaced on their own)."""
    activation = module.nonlinearity
    if not (FusedWanRMSNorm.takes(module.norm1) and FusedWanRMSNorm.takes(module.norm2)):
        return None
    try:
        module.norm1, module.norm2 = (FusedWanRMSNorm(norm, activation) for norm in (module.norm1, module.norm2))
    except ValueError:  # an activation the op does not compute
        return None
    module.nonlinearity = nn.Identity()
    return module, f"WanRMS_norm + {type(activation).__name__}, twice -> channel_rms_norm with the activation"


_DIFFUSERS_COGVIDEOX = "diffusers.models.autoencoders.autoencoder_kl_cogvideox"
_DIFFUSERS_MOCHI = "diffusers.models.autoencoders.autoencoder_kl_mochi"
_DIFFUSERS_WAN = "diffusers.models.autoencoders.autoencoder_kl_wan"
# (class module, class name) -> (replacement, digest of the forward() source it reproduces;
# a replacement returning None keeps the module). The resnets come first: they replace their
# norms with their activation.
_REPLACEMENTS: dict[tuple[str, str], tuple[Callable[[nn.Module], tuple[nn.Module, str] | None], str]] = {
    # MochiResnetBlock3D.forward and MochiChunkedGroupNorm3D.forward as diffusers 0.42.1 writes them.
    (_DIFFUSERS_MOCHI, "MochiResnetBlock3D"):
        (_mochi_resnet, "d0855d30bbbce63ff5dccc8a5c7232e6379d298b90b2434da517f60ebf62d1cf"),
    (_DIFFUSERS_MOCHI, "MochiChunkedGroupNorm3D"):
        (_mochi_norm, "765ff3f4a4c02dc43a31115a31776af63490040acdab4eaa7863ad248daa43c3"),
    # CogVideoXResnetBlock3D.forward, CogVideoXSpatialNorm3D.forward and
    # CogVideoXCausalConv3d.forward as diffusers 0.42.1 writes them.
    (_DIFFUSERS_COGVIDEOX, "CogVideoXResnetBlock3D"):
        (_cogvideox_resnet, "37e2eb624c4e01696fda66cbd6ceef0c7a46e8f3319e2b6095cdc99ccb441c5b"),
    (_DIFFUSERS_COGVIDEOX, "CogVideoXSpatialNorm3D"):
        (_cogvideox_spatial_norm, "d1c450ffaca13947d7fbb3f2ed2a8e9a3d292bdffc4c6dd4993d18bda1491fbe"),
    (_DIFFUSERS_COGVIDEOX, "CogVideoXCausalConv3d"):
        (_cogvideox_causal_conv, "ce0570bf0ae334bd2b2639ab54b0d3e3ec3d1edb658a353eee88adf6acb244ed"),
    # WanResidualBlock.forward, WanRMS_norm.forward and WanCausalConv3d.forward as diffusers
    # 0.42.1 writes them.
    (_DIFFUSERS_WAN, "WanResidualBlock"):
        (_wan_resnet, "82e9104df2acf11ae16c91b6f61d479a3bff498e863a5fedc855c33f79f16007"),
    (_DIFFUSERS_WAN, "WanRMS_norm"): (_wan_norm, "fc44101b65138738706ef4e60103556e615ee77152a633d198ffe671a8de9657"),
    (_DIFFUSERS_WAN, "WanCausalConv3d"):
        (_wan_causal_conv, "afffb99acd515ba2c94ce5b3e4862141effa2236ce8e87a45fae67ca00a2cc29"),
}
# CogVideoXCausalConv3d.fake_context_parallel_forward (its padding in time) as diffusers 0.42.1 writes it.
_COGVIDEOX_TIME_PADDING = "087db175adcb04e91d91a213d28d1a3edb4bdedf803d01fb7ab260b29d64289d"


def replace_library_modules(model: nn.Module) -> list[str]:
    """Replaces, in place, each known library module under ``model`` (not ``model``
    itself) by its cutlassfuse module; one report line per replacement: where, what. The
    walk descends into each module as it is after its replacement (a replaced resnet's new
    norms, not its old ones), but not into cutlassfuse's modules."""
    lines = []

    def visit(parent: nn.Module, path: str) -> None:
        for name, child in list(parent.named_children()):
            where = f"{path}.{name}" if path else name
            replace = entry_for_forward(_REPLACEMENTS, child)
            outcome = replace(child) if replace is not None else None
            if outcome is not None:
                replaced, what = outcome
                setattr(parent, name, replaced)
                lines.append(f"{where}: {type(child).__name__}: {what}")
                child = replaced
            if not type(child).__module__.startswith("cutlassfuse."):  # cutlassfuse's modules are done
                visit(child, where)

    visit(model, "")
    return lines
