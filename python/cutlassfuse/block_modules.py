"""nn.Module front end of the block family: Conv3d or ConvTranspose3d, then GroupNorm or
InstanceNorm3d with an activation before or after it, and the norm with its activation
alone, each computed by one op."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.common_types import _size_3_t

from .blocks import (ACTIVATIONS, _conv_output_size, activation_of_module, as_five_d, explaining_op, in_shape_of,
                     module_tensor)
from . import direct_calls
from .packed_copy import PackedParameters

_EXPLAIN_NORM_OP = torch.ops.cutlassfuse.explain_group_norm_activation.default

_Conv = nn.Conv3d | nn.ConvTranspose3d
_Norm = nn.GroupNorm | nn.InstanceNorm3d

# The activations by the ops' names, as the torch.nn modules that compute them; those
# with a parameter take it (None: the module's default).
_ACTIVATIONS_WITHOUT_PARAMETER = {
    "identity": nn.Identity,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
}
_ACTIVATIONS_WITH_PARAMETER = {
    "leaky_relu": lambda parameter: nn.LeakyReLU(0.01 if parameter is None else parameter),
    "elu": lambda parameter: nn.ELU(1.0 if parameter is None else parameter),
}


def _activation_module(activation: str, parameter: float | None, prelu_parameters: int, channels: int,
                       factory: dict) -> nn.Module:
    """The torch.nn module of the constructors' activation arguments: ``parameter`` is
    LeakyReLU's negative_slope, ELU's alpha or PReLU's initial slope (None: torch.nn's
    default), ``prelu_parameters`` PReLU's num_parameters (1 or ``channels``)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"cutlassfuse: activation must be one of {', '.join(ACTIVATIONS)}; got {activation!r}")
    if activation != "prelu" and prelu_parameters != 1:
        raise ValueError(f"cutlassfuse: prelu_parameters applies to activation='prelu', got {prelu_parameters} with "
                         f"activation={activation!r}")
    if activation == "prelu":
        if prelu_parameters not in (1, channels):
            raise ValueError(f"cutlassfuse: prelu_parameters must be 1 or the {channels} channels, got "
                             f"{prelu_parameters}")
        return nn.PReLU(prelu_parameters, init=0.25 if parameter is None else parameter, **factory)
    if activation in _ACTIVATIONS_WITH_PARAMETER:
        return _ACTIVATIONS_WITH_PARAMETER[activation](parameter)
    if parameter is not None:
        raise ValueError(f"cutlassfuse: activation={activation!r} takes no activation_parameter (leaky_relu, elu and "
                         f"prelu do), got {parameter}")
    return _ACTIVATIONS_WITHOUT_PARAMETER[activation]()


def _norm_module(norm: str, channels: int, num_groups: int | None, eps: float, affine: bool | None,
                 factory: dict) -> nn.Module:
    """nn.GroupNorm for ``norm="group"``, nn.InstanceNorm3d without running statistics
    for ``norm="instance"``; ``affine`` None is the module's default (True for
    GroupNorm, False for InstanceNorm3d)."""
    if norm == "group":
        if num_groups is None:
            raise ValueError("cutlassfuse: norm='group' needs num_groups")
        return nn.GroupNorm(num_groups, channels, eps=eps, affine=True if affine is None else affine, **factory)
    if norm == "instance":
        if num_groups is not None:
            raise ValueError(f"cutlassfuse: norm='instance' normalizes every channel alone and takes no num_groups, "
                             f"got {num_groups}")
        return nn.InstanceNorm3d(channels, eps=eps, affine=bool(affine), track_running_stats=False, **factory)
    raise ValueError(f"cutlassfuse: norm must be 'group' or 'instance', got {norm!r}")


def _norm_groups(norm: nn.Module) -> int:
    """The op's num_groups of the norm: GroupNorm's, or one channel per group for
    InstanceNorm3d, whose statistics are then those of every sample's channel alone."""
    if isinstance(norm, nn.GroupNorm):
        return norm.num_groups
    if isinstance(norm, nn.InstanceNorm3d):
        if norm.track_running_stats:
            raise ValueError("cutlassfuse: InstanceNorm3d with track_running_stats=True normalizes by its running "
                             "statistics in eval mode and updates them in training, which the op does not; use "
                             "track_running_stats=False")
        return norm.num_features
    raise TypeError(f"cutlassfuse: norm must be an nn.GroupNorm or an nn.InstanceNorm3d, got {type(norm).__name__}")


def _norm_channels(norm: _Norm) -> int:
    return norm.num_channels if isinstance(norm, nn.GroupNorm) else norm.num_features


def _channels_last(weight: Tensor) -> Tensor:
    with torch.no_grad():  # a copy of the values: the weight's gradient flows through the weight itself
        return weight.contiguous(memory_format=torch.channels_last_3d)


def _conv_padding(conv: _Conv) -> tuple[int, int, int]:
    """The conv's padding as three ints: "valid" is none, "same" the symmetric padding
    that keeps the size, where the kernel and the dilation make it symmetric (an even
    total padding dilation * (kernel_size - 1) in every dimension)."""
    if conv.padding_mode != "zeros":
        raise ValueError(f"cutlassfuse: the conv's padding_mode must be 'zeros', got {conv.padding_mode!r}")
    if not isinstance(conv.padding, str):
        return conv.padding
    if conv.padding == "valid":
        return (0, 0, 0)
    totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
    if any(total % 2 for total in totals):
        raise ValueError(f"cutlassfuse: padding='same' with kernel_size={conv.kernel_size} and dilation="
                         f"{conv.dilation} pads {totals} in total, more on one side than the other, which the op's "
                         "symmetric padding cannot express; give the conv explicit padding and pad the input with "
                         "F.pad for the rest")
    return tuple(total // 2 for total in totals)


def _check_activation(activation: nn.Module, channels: int) -> None:
    activation_of_module(activation)  # raises for modules the op does not compute
    if isinstance(activation, nn.PReLU) and activation.num_parameters not in (1, channels):
        raise ValueError(f"cutlassfuse: PReLU has {activation.num_parameters} parameters, must be 1 or the "
                         f"{channels} channels")


def _activation_repr(activation: nn.Module) -> list[str]:
    """The constructors' activation keywords that give this module, defaults left out."""
    name, parameter, weight = activation_of_module(activation)
    options = [f"activation={name!r}"]
    if name in _ACTIVATIONS_WITH_PARAMETER:
        options.append(f"activation_parameter={parameter}")
    if weight is not None and weight.numel() != 1:
        options.append(f"prelu_parameters={weight.numel()}")
    return options


class _ConvNormActivation(PackedParameters):
    """The parts Conv3dNormActivation and ConvTranspose3dNormActivation share: the
    modules' checks, from_modules, the call of the op and extra_repr."""

    _conv_type: type[_Conv]
    _transposed: bool

    def _set_modules(self, conv: _Conv, norm: _Norm, activation: nn.Module, activation_before_norm: bool) -> None:
        if not isinstance(conv, self._conv_type):
            raise TypeError(f"cutlassfuse: {type(self).__name__} takes an nn.{self._conv_type.__name__}, got "
                            f"{type(conv).__name__}")
        _conv_padding(conv)
        _norm_groups(norm)
        if _norm_channels(norm) != conv.out_channels:
            raise ValueError(f"cutlassfuse: the norm has {_norm_channels(norm)} channels, the conv gives "
                             f"{conv.out_channels}")
        _check_activation(activation, conv.out_channels)
        self.conv = conv
        self.norm = norm
        self.activation = activation
        self.activation_before_norm = activation_before_norm

    @classmethod
    def from_modules(cls, conv: _Conv, norm: _Norm, activation: nn.Module, *,
                     activation_before_norm: bool = False) -> _ConvNormActivation:
        """The block around existing modules: their very parameters (and hooks, and
        optimizer state keyed on them) are kept, not copied. ``norm``: nn.GroupNorm, or
        nn.InstanceNorm3d without running statistics; ``activation``: one of the modules
        ``cutlassfuse.blocks.activation_of_module`` maps (nn.Identity, ReLU, LeakyReLU,
        PReLU, SiLU, GELU, ELU), applied to the conv's output before the norm with
        ``activation_before_norm``, else to the norm's output."""
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.training = conv.training  # the mode of the layers it stands in for
        block._set_modules(conv, norm, activation, activation_before_norm)
        return block

    def _plus(self, x: Tensor, output_padding: tuple[int, ...], residual: Tensor | None) -> Tensor:
        """The block's output plus `residual` as PyTorch's add computes it: added by the op as
        it writes the output where the residual has the output's shape, dtype and device,
        by PyTorch's add (broadcasting, type promotion) elsewhere."""
        if residual is None:
            return self._call(x, output_padding, None)
        if (isinstance(x, Tensor) and isinstance(residual, Tensor) and x.dim() == 5
                and residual.dtype == x.dtype and residual.device == x.device
                and residual.shape == self._output_shape(x, output_padding)):
            return self._call(x, output_padding, residual)
        return self._call(x, output_padding, None) + residual

    def _output_padding(self, x: Tensor, output_size: list[int] | None) -> tuple[int, ...]:
        conv = self._modules["conv"]  # not through nn.Module.__getattr__: on every call's path
        if not self._transposed:
            if output_size is not None:
                raise TypeError(f"cutlassfuse: {type(self).__name__} takes no output_size")
            return (0, 0, 0)
        if output_size is None:
            return conv.output_padding
        return tuple(conv._output_padding(x, output_size, conv.stride, conv.padding, conv.kernel_size, 3,
                                          conv.dilation))

    def _output_shape(self, x: Tensor, output_padding: tuple[int, ...]) -> torch.Size:
        """The block's output shape for `x`, the last one kept with its input shape and conv
        arguments: the residual's check is on every call's path, and its arithmetic costs
        more host time than comparing them (nothing kept from code torch.compile traces)."""
        conv = self._modules["conv"]  # not through nn.Module.__getattr__: on every call's path
        key = (x.shape, output_padding, conv.kernel_size, conv.stride, conv.padding, conv.dilation, conv.out_channels)
        kept = self.__dict__.get("_kept_output_shape")
        if kept is not None and kept[0] == key:
            return kept[1]
        spatial = _conv_output_size(x.shape[2:], conv.kernel_size, conv.stride, _conv_padding(conv), output_padding,
                                    conv.dilation, self._transposed)
        shape = torch.Size((x.shape[0], conv.out_channels, *spatial))
        if not torch.compiler.is_compiling():
            self.__dict__["_kept_output_shape"] = (key, shape)
        return shape

    def _call(self, x: Tensor, output_padding: tuple[int, ...], residual: Tensor | None):
        # The op itself, not the functional wrapper (the modules already hold their options
        # as 3-tuples), through its CUDA kernel where the dispatcher would do nothing else:
        # small calls are bound by the host's time per call.
        return direct_calls.conv3d_norm_activation(self._op_arguments(x, output_padding, residual))

    def _op_arguments(self, x: Tensor, output_padding: tuple[int, ...], residual: Tensor | None = None) -> tuple:
        children = self._modules
        conv, norm = children["conv"], children["norm"]
        name, parameter, weight = activation_of_module(children["activation"])
        return (x, module_tensor(conv, "weight"), module_tensor(conv, "bias"), conv.stride, _conv_padding(conv),
                output_padding, conv.groups, conv.dilation, self._transposed, _norm_groups(norm),
                module_tensor(norm, "weight"), module_tensor(norm, "bias"), norm.eps, name, parameter, weight,
                self.activation_before_norm, self._packed_weight(conv, x), residual)

    def _packed_weight(self, conv: _Conv, x: Tensor) -> Tensor | None:
        """The conv's weight in channels_last_3d, kept while the weight is unchanged
        (PackedParameters), for the calls that convolve channels-last: channels-last input,
        and float16/bfloat16 input on CUDA, which the kernels convolve channels-last. The
        op reads it in place of the weight there (same values, so the same output), which
        spares a copy of the weight per call: an allocation and a launch, as long as the
        rest of a small layer's kernels. The weight itself stays the op's argument, so the
        output's layout and the weight's gradient are the weight's. None elsewhere."""
        weight = module_tensor(conv, "weight")
        # Anything else (a Proxy while torch.fx traces, a wrong input) reaches the op as it
        # is, which says what is wrong with it.
        if not isinstance(x, Tensor) or x.dim() != 5 or not x.is_cuda:
            return None
        if weight.is_contiguous(memory_format=torch.channels_last_3d):
            return None
        sixteen_bits = x.dtype in (torch.float16, torch.bfloat16)
        if not sixteen_bits and (x.is_contiguous() or not x.is_contiguous(memory_format=torch.channels_last_3d)):
            return None
        return self._packed_copy("weight", weight, _channels_last)

    def explain(self, x: Tensor, *, residual: Tensor | None = None) -> str:
        """Which implementation ``self(x, residual=residual)`` runs in the current grad mode
        (kernel path, or PyTorch's composite) and why; a call in grad mode with parameters
        that require grad keeps what its backward reads."""
        arguments = self._op_arguments(x, tuple(getattr(self.conv, "output_padding", (0, 0, 0))), residual)
        return explaining_op(arguments)(*arguments)

    def extra_repr(self) -> str:
        """The constructor's arguments that give this block, defaults left out, with the
        options as nn.Conv3d / nn.ConvTranspose3d print theirs."""
        conv, norm = self.conv, self.norm
        options = [f"{conv.in_channels}, {conv.out_channels}", f"kernel_size={conv.kernel_size}",
                   f"stride={conv.stride}"]
        defaults = {"padding": (0, 0, 0), "output_padding": (0, 0, 0), "dilation": (1, 1, 1), "groups": 1}
        options += [f"{name}={getattr(conv, name)!r}" for name, default in defaults.items()
                    if getattr(conv, name) != default]
        if conv.bias is None:
            options.append("bias=False")
        if isinstance(norm, nn.GroupNorm):
            options += ["norm='group'", f"num_groups={norm.num_groups}"]
        else:
            options.append("norm='instance'")
        options += [f"eps={norm.eps}", f"affine={norm.affine}", *_activation_repr(self.activation)]
        if self.activation_before_norm:
            options.append("activation_before_norm=True")
        return ", ".join(options)


class Conv3dNormActivation(_ConvNormActivation):
    """``act(norm(conv(x)))``, or ``norm(act(conv(x)))`` with ``activation_before_norm``,
    computed by one op (``cutlassfuse.conv3d_norm_activation``).

    The positional arguments are nn.Conv3d's; the norm is nn.GroupNorm (``norm="group"``
    with ``num_groups``) or nn.InstanceNorm3d without running statistics
    (``norm="instance"``, the default); ``affine`` defaults as those modules do (True for
    GroupNorm, False for InstanceNorm3d). ``activation`` is one of ``ACTIVATIONS``, the
    torch.nn module of that name; ``activation_parameter`` is LeakyReLU's negative_slope,
    ELU's alpha or PReLU's initial slope (None: torch.nn's default), ``prelu_parameters``
    PReLU's num_parameters (1 or out_channels).

    The parameters live in ``conv`` (nn.Conv3d), ``norm`` and ``activation``, created in
    that order: the state_dict keys are ``conv.weight``, ``conv.bias``, ``norm.weight``,
    ``norm.bias`` (with affine) and ``activation.weight`` (PReLU), and same-seed
    initialisation gives the parameters of the same three modules built in that order
    (an ``nn.Sequential`` of modules named conv, norm, activation holds the same keys).
    """

    _conv_type = nn.Conv3d
    _transposed = False

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _size_3_t,
        stride: _size_3_t = 1,
        padding: _size_3_t | str = 0,
        dilation: _size_3_t = 1,
        groups: int = 1,
        bias: bool = True,
        *,
        norm: str = "instance",
        num_groups: int | None = None,
        eps: float = 1e-5,
        affine: bool | None = None,
        activation: str = "relu",
        activation_parameter: float | None = None,
        prelu_parameters: int = 1,
        activation_before_norm: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self._set_modules(
            nn.Conv3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, bias=bias, **factory),
            _norm_module(norm, out_channels, num_groups, eps, affine, factory),
            _activation_module(activation, activation_parameter, prelu_parameters, out_channels, factory),
            activation_before_norm)

    def forward(self, x: Tensor, *, residual: Tensor | None = None) -> Tensor:
        """The block of ``x``; with ``residual``, ``self(x) + residual`` (a residual
        connection after the block), which the op adds as it writes the output where the
        residual has the output's shape, dtype and device (any layout), and PyTorch's add
        computes otherwise."""
        return self._plus(x, (0, 0, 0), residual)


class ConvTranspose3dNormActivation(_ConvNormActivation):
    """``act(norm(conv_transpose(x)))``, or ``norm(act(conv_transpose(x)))`` with
    ``activation_before_norm``, computed by one op
    (``cutlassfuse.conv_transpose3d_norm_activation``).

    The positional arguments are nn.ConvTranspose3d's; the keywords and the parameters'
    names (``conv.weight``, ``conv.bias``, ``norm.weight``, ``norm.bias``,
    ``activation.weight``) as Conv3dNormActivation's, ``conv`` an nn.ConvTranspose3d.
    """

    _conv_type = nn.ConvTranspose3d
    _transposed = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _size_3_t,
        stride: _size_3_t = 1,
        padding: _size_3_t = 0,
        output_padding: _size_3_t = 0,
        groups: int = 1,
        bias: bool = True,
        dilation: _size_3_t = 1,
        *,
        norm: str = "instance",
        num_groups: int | None = None,
        eps: float = 1e-5,
        affine: bool | None = None,
        activation: str = "relu",
        activation_parameter: float | None = None,
        prelu_parameters: int = 1,
        activation_before_norm: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self._set_modules(
            nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding,
                               output_padding=output_padding, groups=groups, bias=bias, dilation=dilation,
                               **factory),
            _norm_module(norm, out_channels, num_groups, eps, affine, factory),
            _activation_module(activation, activation_parameter, prelu_parameters, out_channels, factory),
            activation_before_norm)

    def forward(self, x: Tensor, output_size: list[int] | None = None, *, residual: Tensor | None = None) -> Tensor:
        """``output_size`` as in ``nn.ConvTranspose3d.forward``: picks the output padding
        that gives this (D, H, W) (U-Net decoders pass the skip connection's size);
        ``residual`` as Conv3dNormActivation's."""
        return self._plus(x, self._output_padding(x, output_size), residual)


class GroupNormActivation(nn.Module):
    """``act(group_norm(x))`` computed by one op (``cutlassfuse.group_norm_activation``).

    The positional arguments are nn.GroupNorm's, the activation keywords as
    Conv3dNormActivation's. The parameters live in ``norm`` (nn.GroupNorm) and
    ``activation``, created in that order: state_dict keys ``norm.weight``,
    ``norm.bias`` (with affine) and ``activation.weight`` (PReLU). ``from_modules`` also
    takes an nn.InstanceNorm3d without running statistics (one channel per group). The
    input is (N, C, D, H, W), with nn.GroupNorm (N, C, *) of any spatial rank.
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        *,
        activation: str = "relu",
        activation_parameter: float | None = None,
        prelu_parameters: int = 1,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self._set_modules(nn.GroupNorm(num_groups, num_channels, eps=eps, affine=affine, **factory),
                          _activation_module(activation, activation_parameter, prelu_parameters, num_channels, factory))

    def _set_modules(self, norm: _Norm, activation: nn.Module) -> None:
        _norm_groups(norm)
        _check_activation(activation, _norm_channels(norm))
        self.norm = norm
        self.activation = activation

    @classmethod
    def from_modules(cls, norm: _Norm, activation: nn.Module) -> GroupNormActivation:
        """The block around existing modules, their very parameters kept: ``norm`` an
        nn.GroupNorm, or an nn.InstanceNorm3d without running statistics; ``activation``
        as in ``Conv3dNormActivation.from_modules``."""
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.training = norm.training
        block._set_modules(norm, activation)
        return block

    def extra_repr(self) -> str:
        """nn.GroupNorm's options (an InstanceNorm3d's as one group per channel), then the
        activation's keywords, defaults left out."""
        norm = self.norm
        return ", ".join([f"{_norm_groups(norm)}, {_norm_channels(norm)}", f"eps={norm.eps}", f"affine={norm.affine}",
                          *_activation_repr(self.activation)])

    def forward(self, x: Tensor) -> Tensor:
        """``x``: (N, C, D, H, W); with an nn.GroupNorm (N, C, *) of any spatial rank, as
        nn.GroupNorm takes it."""
        return in_shape_of(direct_calls.group_norm_activation(self._op_arguments(x)), x)

    def explain(self, x: Tensor) -> str:
        """Which implementation ``self(x)`` runs and why, for a call that keeps nothing
        for a backward."""
        return _EXPLAIN_NORM_OP(*self._op_arguments(x))

    def _op_arguments(self, x: Tensor) -> tuple:
        children = self._modules
        norm = children["norm"]
        name, parameter, weight = activation_of_module(children["activation"])
        # GroupNorm's input of another spatial rank as the op's 5-D view; InstanceNorm3d's
        # as it is (a 4-D input is unbatched, which the op refuses).
        five_d = as_five_d(x) if isinstance(norm, nn.GroupNorm) else x
        return (five_d, _norm_groups(norm), module_tensor(norm, "weight"), module_tensor(norm, "bias"), norm.eps, name,
                parameter, weight)


class FrameGroupNormActivation(nn.Module):
    """``act(group_norm(frame))`` of every frame of an (N, C, T, H, W) video tensor: a
    GroupNorm whose statistics are per (sample, frame, group), as video autoencoders that
    normalize frame by frame compute it (diffusers' Mochi decoder), by one
    ``group_norm_activation`` op over the N * T frames.

    The frames are the op's samples: in channels-last order an (N, C, T, H, W) tensor is
    (N * T, C, 1, H, W) channels-last without a copy, so the input is made channels-last
    (one conversion for NCDHW input, which a GroupNorm of the frames copies too) and the
    output is channels-last. ``block`` is the GroupNormActivation that normalizes each
    frame; its parameters are the module's.
    """

    def __init__(self, block: GroupNormActivation) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        frames = self._frames(x)
        n, c, t, h, w = x.shape
        return self.block(frames).reshape(n, t, c, h, w).transpose(1, 2)

    def explain(self, x: Tensor) -> str:
        """Which implementation ``self(x)`` runs on the frames and why, for a call that
        keeps nothing for a backward."""
        return self.block.explain(self._frames(x))

    @staticmethod
    def _frames(x: Tensor) -> Tensor:
        """``x`` as (N * T, C, 1, H, W) channels-last, each frame a sample."""
        if x.dim() != 5:
            raise ValueError(f"cutlassfuse: FrameGroupNormActivation takes (N, C, T, H, W), got shape {tuple(x.shape)}")
        n, c, t, h, w = x.shape
        packed = x.contiguous(memory_format=torch.channels_last_3d)
        # The channels-last strides written out: a size-one dimension's stride is free, and
        # PyTorch reads some choices of it as NCDHW.
        return packed.as_strided((n * t, c, 1, h, w), (h * w * c, 1, h * w * c, w * c, c))
