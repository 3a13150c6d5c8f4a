"""The block family's functional API and fake (meta) kernels: a convolution (Conv3d or
ConvTranspose3d), GroupNorm or InstanceNorm, and an activation before or after the norm,
as one op; and GroupNorm + activation with no convolution in front."""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor, nn
from torch._prims_common import suggest_memory_format

from .ops import IntOrTriple, _int64, _statistics_dtype, _tracked, _triple

_BLOCK = "cutlassfuse::conv3d_norm_activation"
_BLOCK_FOR_BACKWARD = "cutlassfuse::conv3d_norm_activation_for_backward"
_NORM = "cutlassfuse::group_norm_activation"
_NORM_FOR_BACKWARD = "cutlassfuse::group_norm_activation_for_backward"
_NORM_ACTIVATION_BACKWARD = "cutlassfuse::norm_activation_backward"

ACTIVATIONS = ("identity", "relu", "leaky_relu", "prelu", "silu", "gelu", "gelu_tanh", "elu")
# torch.nn's defaults of the activations' constants (LeakyReLU's negative_slope, ELU's alpha).
_DEFAULT_PARAMETERS = {"leaky_relu": 0.01, "elu": 1.0}
_INT64_MAX = 2**63 - 1


def module_tensor(module: nn.Module, name: str) -> Tensor | None:
    """``module.<name>`` for a parameter, read from the module's parameter dict: the
    attribute goes through nn.Module.__getattr__'s Python fallback, about a microsecond a
    read, which the host-bound calls of small layers feel. A parameter moved out of the
    dict (torch.nn.utils.parametrize, weight_norm) is read as the attribute it became."""
    parameters = module._parameters
    return parameters[name] if name in parameters else getattr(module, name)


def activation_of_module(module: nn.Module) -> tuple[str, float, Tensor | None]:
    """The op's ``(activation, activation_parameter, activation_weight)`` of a torch.nn
    activation module; ValueError for a module the ops do not compute."""
    if isinstance(module, nn.Identity):
        return "identity", 0.0, None
    if isinstance(module, nn.ReLU):
        return "relu", 0.0, None
    if isinstance(module, nn.LeakyReLU):
        return "leaky_relu", float(module.negative_slope), None
    if isinstance(module, nn.PReLU):
        return "prelu", 0.0, module_tensor(module, "weight")
    if isinstance(module, nn.SiLU):
        return "silu", 0.0, None
    if isinstance(module, nn.GELU):
        return ("gelu_tanh" if module.approximate == "tanh" else "gelu"), 0.0, None
    if isinstance(module, nn.ELU):
        return "elu", float(module.alpha), None
    if _is_monai_silu(module):
        return "silu", 0.0, None
    raise ValueError(f"cutlassfuse: the activation {module!r} is not one the fused blocks compute "
                     f"(nn.Identity, ReLU, LeakyReLU, PReLU, SiLU, GELU, ELU; MONAI's Swish with alpha 1 "
                     f"and MemoryEfficientSwish)")


def _is_monai_silu(module: nn.Module) -> bool:
    """MONAI's swish modules that compute SiLU (x * sigmoid(x)), recognized without
    importing MONAI: MemoryEfficientSwish, and Swish with alpha 1."""
    kind = type(module)
    if not kind.__module__.startswith("monai."):
        return False
    return kind.__name__ == "MemoryEfficientSwish" or (kind.__name__ == "Swish" and
                                                        float(getattr(module, "alpha", 0.0)) == 1.0)


def _activation_arguments(activation: str, activation_parameter: float | None) -> tuple[str, float]:
    if activation not in ACTIVATIONS:
        raise ValueError(f"cutlassfuse: unknown activation {activation!r}; known: {', '.join(ACTIVATIONS)}")
    if activation_parameter is None:
        activation_parameter = _DEFAULT_PARAMETERS.get(activation, 0.0)
    return activation, float(activation_parameter)


def _block_arguments(transposed: bool, a: dict) -> tuple:
    """The schema's arguments from the functional's (bound by name)."""
    name, parameter = _activation_arguments(a["activation"], a["activation_parameter"])
    return (a["input"], a["weight"], a["bias"], _triple(a["stride"], "stride"), _triple(a["padding"], "padding"),
            _triple(a.get("output_padding", 0), "output_padding"), _int64(int(a["groups"]), "groups"),
            _triple(a["dilation"], "dilation"), transposed, _int64(int(a["num_groups"]), "num_groups"),
            a["norm_weight"], a["norm_bias"], float(a["eps"]), name, parameter, a["activation_weight"],
            bool(a["activation_before_norm"]), None, a["residual"])


def _norm_arguments(a: dict) -> tuple:
    name, parameter = _activation_arguments(a["activation"], a["activation_parameter"])
    return (a["input"], _int64(int(a["num_groups"]), "num_groups"), a["weight"], a["bias"], float(a["eps"]), name,
            parameter, a["activation_weight"])


def conv3d_norm_activation(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    dilation: IntOrTriple = 1,
    groups: int = 1,
    *,
    num_groups: int,
    norm_weight: Tensor | None = None,
    norm_bias: Tensor | None = None,
    eps: float = 1e-5,
    activation: str = "relu",
    activation_parameter: float | None = None,
    activation_weight: Tensor | None = None,
    activation_before_norm: bool = False,
    residual: Tensor | None = None,
) -> Tensor:
    """``act(F.group_norm(F.conv3d(input, weight, bias, stride, padding, dilation, groups),
    num_groups, norm_weight, norm_bias, eps))`` in one op, or with
    ``activation_before_norm=True`` ``F.group_norm(act(F.conv3d(...)), ...)``; with
    ``residual`` (the output's shape and the input's dtype, any layout) that plus
    ``residual``, added as the output is written (a residual connection after the block,
    MONAI's ResidualUnit).

    The positional arguments are those of ``torch.nn.functional.conv3d``. InstanceNorm3d
    is ``num_groups`` = the output channels. ``activation``: one of ``ACTIVATIONS``;
    ``activation_parameter`` is LeakyReLU's negative_slope and ELU's alpha (None: their
    torch.nn defaults, 0.01 and 1.0); ``activation_weight`` is PReLU's weight (1 or
    C_out values). The output has the input's dtype, and is channels_last_3d when the
    input or the weight is, contiguous otherwise (as PyTorch's convolution); a residual
    in the other layout is read through a copy in the output's.
    """
    return torch.ops.cutlassfuse.conv3d_norm_activation(*_block_arguments(False, dict(
        input=input, weight=weight, bias=bias, stride=stride, padding=padding, dilation=dilation, groups=groups,
        num_groups=num_groups, norm_weight=norm_weight, norm_bias=norm_bias, eps=eps, activation=activation,
        activation_parameter=activation_parameter, activation_weight=activation_weight,
        activation_before_norm=activation_before_norm, residual=residual)))


def conv_transpose3d_norm_activation(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntOrTriple = 1,
    padding: IntOrTriple = 0,
    output_padding: IntOrTriple = 0,
    groups: int = 1,
    dilation: IntOrTriple = 1,
    *,
    num_groups: int,
    norm_weight: Tensor | None = None,
    norm_bias: Tensor | None = None,
    eps: float = 1e-5,
    activation: str = "relu",
    activation_parameter: float | None = None,
    activation_weight: Tensor | None = None,
    activation_before_norm: bool = False,
    residual: Tensor | None = None,
) -> Tensor:
    """``conv3d_norm_activation`` with ``torch.nn.functional.conv_transpose3d``'s
    convolution and positional arguments (weight (C_in, C_out / groups, kD, kH, kW))."""
    return torch.ops.cutlassfuse.conv3d_norm_activation(*_block_arguments(True, dict(
        input=input, weight=weight, bias=bias, stride=stride, padding=padding, output_padding=output_padding,
        groups=groups, dilation=dilation, num_groups=num_groups, norm_weight=norm_weight, norm_bias=norm_bias,
        eps=eps, activation=activation, activation_parameter=activation_parameter, activation_weight=activation_weight,
        activation_before_norm=activation_before_norm, residual=residual)))


def as_five_d(input: Tensor) -> Tensor:
    """An (N, C, *) tensor as (N, C, D, H, W), for GroupNorm, whose statistics do not
    depend on how the spatial positions are arranged: fewer spatial dimensions get
    dimensions of size one (a view, channels-last where the input is), more are merged
    into the last (a view where the strides allow it, else a copy)."""
    # A plain raise: torch.compile traces this function, and a message closure over the
    # input would break its graph at every call.
    if input.dim() < 2:
        raise ValueError(f"cutlassfuse: input must be (N, C, *), got shape {tuple(input.shape)}")
    if input.dim() == 5:
        # As it is: a view restrides a batch of one, which PyTorch then reads as NCDHW
        # however its elements lie (the op would convert it).
        return input
    if input.dim() > 5:
        return input.reshape(*input.shape[:4], -1)
    return input.view(*input.shape, *[1] * (5 - input.dim()))


def in_shape_of(output: Tensor, input: Tensor) -> Tensor:
    """The op's 5-D output of ``as_five_d(input)`` in ``input``'s shape: as it is for a
    5-D input (for the reason ``as_five_d`` gives), else a view."""
    return output if input.dim() == 5 else output.view(input.shape)


def group_norm_activation(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
    *,
    activation: str = "relu",
    activation_parameter: float | None = None,
    activation_weight: Tensor | None = None,
) -> Tensor:
    """``act(F.group_norm(input, num_groups, weight, bias, eps))`` in one op, for a norm
    no convolution precedes; ``input`` is (N, C, *) as F.group_norm takes it (2-D and
    1-D layers too). Statistics are split over many thread
    blocks per (sample, group), so batch 1 with few groups fills the GPU. The output has
    the input's memory format (contiguous or channels-last)."""
    return in_shape_of(torch.ops.cutlassfuse.group_norm_activation(*_norm_arguments(dict(
        input=as_five_d(input), num_groups=num_groups, weight=weight, bias=bias, eps=eps, activation=activation,
        activation_parameter=activation_parameter, activation_weight=activation_weight))), input)


def explain_block(function, *args, **kwargs) -> str:
    """Which implementation ``function(*args, **kwargs)`` runs in the current grad mode,
    and why: ``function`` is ``conv3d_norm_activation``, ``conv_transpose3d_norm_activation``
    or ``group_norm_activation``. A convolution block called in grad mode on tensors that
    require grad keeps what its backward reads, and may take another path than under
    ``torch.no_grad()``."""
    bound = inspect.signature(function).bind(*args, **kwargs)
    bound.apply_defaults()
    if function is group_norm_activation:
        arguments = {**bound.arguments, "input": as_five_d(bound.arguments["input"])}
        return torch.ops.cutlassfuse.explain_group_norm_activation(*_norm_arguments(arguments))
    transposed = function is conv_transpose3d_norm_activation
    if not transposed and function is not conv3d_norm_activation:
        raise ValueError(f"cutlassfuse: explain_block explains the block functions, got {function!r}")
    arguments = _block_arguments(transposed, bound.arguments)
    return explaining_op(arguments)(*arguments)


def explaining_op(block_arguments: tuple):
    """The explain op of a convolution block called with ``block_arguments`` (the op's
    own, in order) in the current grad mode: the one keeping for a backward when a call
    would be differentiated."""
    # Its tensors are the differentiable ones: input, weight, bias, the norm's and PReLU's.
    ops = torch.ops.cutlassfuse
    return (ops.explain_conv3d_norm_activation_for_backward if _tracked(block_arguments)
            else ops.explain_conv3d_norm_activation)


def _conv_output_size(input_size, kernel_size, stride, padding, output_padding, dilation, transposed) -> list[int]:
    if transposed:
        return [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
                for i, k, s, p, op, d in zip(input_size, kernel_size, stride, padding, output_padding, dilation,
                                             strict=True)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 if i + 2 * p - d * (k - 1) - 1 >= 0 else 0
            for i, k, s, p, d in zip(input_size, kernel_size, stride, padding, dilation, strict=True)]


def _check_vector(tensor, name: str, size, input: Tensor, same_dtype: bool) -> None:
    if tensor is None:
        return
    torch._check(tensor.device == input.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found {name} on "
                         f"{tensor.device} and input on {input.device}")
    torch._check_value(tensor.dim() == 1 and tensor.shape[0] == size,
                       lambda: f"cutlassfuse: {name} must have shape ({size},), got {tuple(tensor.shape)}")
    torch._check_type(tensor.dtype.is_floating_point,
                      lambda: f"cutlassfuse: {name} must be a floating-point tensor, got {tensor.dtype}")
    torch._check_type(not same_dtype or tensor.dtype == input.dtype,
                      lambda: f"cutlassfuse: {name} must have the input's dtype {input.dtype}, got {tensor.dtype}")


def _check_norm_activation(input, channels, num_groups, norm_weight, norm_bias, eps, activation, activation_parameter,
                           activation_weight) -> None:
    torch._check_value(num_groups > 0 and channels % num_groups == 0,
                       lambda: f"cutlassfuse: num_groups ({num_groups}) must be positive and divide the channels "
                               f"({channels})")
    torch._check_value(math.isfinite(eps) and eps >= 0,
                       lambda: f"cutlassfuse: eps must be finite and non-negative, got {eps}")
    _check_vector(norm_weight, "norm_weight", channels, input, same_dtype=False)
    _check_vector(norm_bias, "norm_bias", channels, input, same_dtype=False)
    torch._check_value(activation in ACTIVATIONS,
                       lambda: f"cutlassfuse: unknown activation '{activation}'; known: {', '.join(ACTIVATIONS)}")
    torch._check_value(math.isfinite(activation_parameter),
                       lambda: f"cutlassfuse: activation_parameter must be finite, got {activation_parameter}")
    if activation != "prelu":
        torch._check_value(activation_weight is None,
                           lambda: f"cutlassfuse: activation_weight is PReLU's; activation '{activation}' takes none")
        return
    torch._check_value(activation_weight is not None,
                       lambda: "cutlassfuse: activation 'prelu' needs activation_weight (nn.PReLU's weight)")
    torch._check(activation_weight.device == input.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found activation_weight "
                         f"on {activation_weight.device} and input on {input.device}")
    torch._check_value(activation_weight.dim() == 1 and activation_weight.shape[0] in (1, channels),
                       lambda: f"cutlassfuse: activation_weight must have shape (1,) or ({channels},), got "
                               f"{tuple(activation_weight.shape)}")
    torch._check_type(activation_weight.dtype.is_floating_point,
                      lambda: f"cutlassfuse: activation_weight must be a floating-point tensor, got "
                              f"{activation_weight.dtype}")


def _check_input(input: Tensor, shape: str) -> None:
    torch._check_value(input.dim() == 5, lambda: f"cutlassfuse: input must be 5-D {shape}, got {input.dim()}-D with "
                                                 f"shape {tuple(input.shape)}")
    torch._check_type(input.dtype.is_floating_point,
                      lambda: f"cutlassfuse: input must be a floating-point tensor, got {input.dtype}")


def _check_packed_weight(packed: Tensor | None, weight: Tensor) -> None:
    """A module's kept copy of the weight: the weight's shape, dtype and device, channels-last."""
    if packed is None:
        return
    torch._check(packed.device == weight.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found packed_weight on "
                         f"{packed.device} and input on {weight.device}")
    torch._check_value(packed.shape == weight.shape, lambda: f"cutlassfuse: packed_weight must have weight's shape "
                                                             f"{list(weight.shape)}, got {list(packed.shape)}")
    torch._check_type(packed.dtype == weight.dtype, lambda: f"cutlassfuse: packed_weight must have weight's dtype "
                                                            f"{weight.dtype}, got {packed.dtype}")
    torch._check_value(packed.is_contiguous(memory_format=torch.channels_last_3d),
                       lambda: "cutlassfuse: packed_weight must be channels_last_3d (weight.contiguous(memory_format="
                               f"torch.channels_last_3d)), got strides {packed.stride()}")


def _check_residual(residual: Tensor | None, shape: tuple, input: Tensor) -> None:
    """The residual added to the block's output: the output's shape, the input's dtype and device."""
    if residual is None:
        return
    torch._check(residual.device == input.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found residual on "
                         f"{residual.device} and input on {input.device}")
    torch._check_value(tuple(residual.shape) == tuple(shape),
                       lambda: f"cutlassfuse: residual must have the output's shape {list(shape)}, got "
                               f"{list(residual.shape)}")
    torch._check_type(residual.dtype == input.dtype,
                      lambda: f"cutlassfuse: residual must have the input's dtype {input.dtype}, got "
                              f"{residual.dtype}")


@torch.library.register_fake(_BLOCK)
def _block_fake(input, weight, bias, stride, padding, output_padding, groups, dilation, transposed, num_groups,
                norm_weight, norm_bias, eps, activation, activation_parameter, activation_weight,
                activation_before_norm, packed_weight=None, residual=None):
    """The block's output without computing it; the same checks, exception kinds and
    messages as the C++ validation."""
    _check_input(input, "(N, C_in, D, H, W)")
    torch._check_value(weight.dim() == 5, lambda: f"cutlassfuse: weight must be 5-D, got {weight.dim()}-D with shape "
                                                  f"{tuple(weight.shape)}")
    torch._check_type(weight.dtype == input.dtype,
                      lambda: f"cutlassfuse: weight dtype {weight.dtype} differs from input dtype {input.dtype}")
    torch._check(weight.device == input.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found weight on "
                         f"{weight.device} and input on {input.device}")
    torch._check_value(groups > 0, lambda: f"cutlassfuse: groups must be positive, got {groups}")
    torch._check_value(all(s > 0 for s in stride), lambda: f"cutlassfuse: stride must be positive, got {stride}")
    torch._check_value(all(d > 0 for d in dilation), lambda: f"cutlassfuse: dilation must be positive, got {dilation}")
    torch._check_value(all(p >= 0 for p in padding),
                       lambda: f"cutlassfuse: padding must be non-negative, got {padding}")
    if transposed:
        torch._check_value(all(0 <= op and (op < s or op < d) for s, d, op in zip(stride, dilation, output_padding,
                                                                                   strict=True)),
                           lambda: f"cutlassfuse: output_padding must be smaller than either stride or dilation, got "
                                   f"output_padding={output_padding}, stride={stride}, dilation={dilation}")
    else:
        torch._check_value(all(op == 0 for op in output_padding),
                           lambda: f"cutlassfuse: output_padding is a transposed convolution's, got {output_padding} "
                                   f"for Conv3d")
    in_channels = input.shape[1]
    torch._check_value(all(extent > 0 for extent in input.shape[1:]),
                       lambda: f"cutlassfuse: only the batch of the input may be empty, got shape {tuple(input.shape)}")
    torch._check_value(in_channels % groups == 0,
                       lambda: f"cutlassfuse: input channels ({in_channels}) must be divisible by groups ({groups})")
    if transposed:
        torch._check_value(weight.shape[0] == in_channels,
                           lambda: f"cutlassfuse: weight.shape[0] ({weight.shape[0]}) must equal the input's channels "
                                   f"({in_channels})")
        out_channels = weight.shape[1] * groups
    else:
        torch._check_value(weight.shape[1] * groups == in_channels,
                           lambda: f"cutlassfuse: weight.shape[1] * groups ({weight.shape[1]} * {groups}) must equal "
                                   f"the input's channels ({in_channels})")
        out_channels = weight.shape[0]
        torch._check_value(out_channels % groups == 0,
                           lambda: f"cutlassfuse: output channels ({out_channels}) must be divisible by groups "
                                   f"({groups})")
    torch._check_value(out_channels > 0, lambda: "cutlassfuse: weight gives zero output channels")
    torch._check_value(all(k > 0 for k in weight.shape[2:]),
                       lambda: f"cutlassfuse: kernel size must be positive, got weight shape {tuple(weight.shape)}")
    _check_packed_weight(packed_weight, weight)
    spatial = _conv_output_size(input.shape[2:], weight.shape[2:], stride, padding, output_padding, dilation,
                                transposed)
    torch._check_value(all(extent > 0 for extent in spatial),
                       lambda: f"cutlassfuse: the output would be empty (spatial size {spatial})")
    output_bytes = torch.sym_max(input.shape[0], 1) * out_channels * math.prod(spatial) * input.element_size()
    torch._check_value(output_bytes <= _INT64_MAX,
                       lambda: f"cutlassfuse: the output size overflows: input {list(input.shape)}, weight "
                               f"{list(weight.shape)}, stride {stride}, padding {padding}, output_padding "
                               f"{output_padding} and dilation {dilation} give an output of more than 2^63 - 1 bytes "
                               f"(PyTorch's limit on a tensor's storage)")
    _check_vector(bias, "bias", out_channels, input, same_dtype=True)
    _check_norm_activation(input, out_channels, num_groups, norm_weight, norm_bias, eps, activation,
                           activation_parameter, activation_weight)
    _check_residual(residual, (input.shape[0], out_channels, *spatial), input)
    channels_last = torch.channels_last_3d in (suggest_memory_format(input), suggest_memory_format(weight))
    return torch.empty((input.shape[0], out_channels, *spatial), dtype=input.dtype, device=input.device,
                       memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)


@torch.library.register_fake(_BLOCK_FOR_BACKWARD)
def _block_for_backward_fake(*args):
    """The block's output, and what its backward reads: the convolution's output without
    its bias (the output's shape and dtype; channels-last for float16/bfloat16 on CUDA,
    where the kernels convolve channels-last operands, else the output's memory format)
    and the norm's mean and rstd ([batch, num_groups], float64 for float64 calls, else
    float32)."""
    out = _block_fake(*args)
    num_groups = args[9]
    statistics = out.new_empty((out.shape[0], num_groups), dtype=_statistics_dtype(out.dtype))
    kept = torch.empty_like(out)
    if out.device.type == "cuda" and out.dtype in (torch.float16, torch.bfloat16):
        kept = kept.contiguous(memory_format=torch.channels_last_3d)
    return out, kept, statistics, statistics.clone()


@torch.library.register_fake(_NORM)
def _norm_fake(input, num_groups, norm_weight, norm_bias, eps, activation, activation_parameter, activation_weight):
    """The standalone norm's output: the input's shape, dtype and memory format."""
    _check_input(input, "(N, C, D, H, W)")
    torch._check_value(input.shape[1] > 0,
                       lambda: f"cutlassfuse: input must have channels, got shape {tuple(input.shape)}")
    _check_norm_activation(input, input.shape[1], num_groups, norm_weight, norm_bias, eps, activation,
                           activation_parameter, activation_weight)
    return torch.empty_like(input, memory_format=suggest_memory_format(input))


@torch.library.register_fake(_NORM_FOR_BACKWARD)
def _norm_for_backward_fake(input, num_groups, *args):
    out = _norm_fake(input, num_groups, *args)
    statistics = out.new_empty((out.shape[0], num_groups), dtype=_statistics_dtype(out.dtype))
    return out, statistics, statistics.clone()


def _check_statistic(t: Tensor, name: str, batch, num_groups: int, input: Tensor) -> None:
    torch._check(t.device == input.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found {name} on "
                         f"{t.device} and input on {input.device}")
    torch._check_value(t.dim() == 2 and t.shape[0] == batch and t.shape[1] == num_groups,
                       lambda: f"cutlassfuse: {name} must have shape ({batch}, {num_groups}), got {tuple(t.shape)}")
    torch._check_type(t.dtype.is_floating_point,
                      lambda: f"cutlassfuse: {name} must be a floating-point tensor, got {t.dtype}")


@torch.library.register_fake(_NORM_ACTIVATION_BACKWARD)
def _norm_activation_backward_fake(grad_output, conv_output, bias, mean, rstd, norm_weight, norm_bias, num_groups,
                                   activation, activation_parameter, activation_weight, activation_before_norm):
    """The gradients of the norm, the activation around it and the convolution's bias:
    conv_output's (its shape, dtype and suggested memory format), gamma's, beta's and the
    bias's ([channels] each, also without gamma, beta or bias), PReLU's weight's (its
    shape, else (0,)); all but the first float64 for float64 calls, else float32."""
    torch._check_value(conv_output.dim() == 5,
                       lambda: f"cutlassfuse: conv_output must be 5-D (N, C, D, H, W), got {conv_output.dim()}-D with "
                               f"shape {tuple(conv_output.shape)}")
    torch._check_type(conv_output.dtype.is_floating_point,
                      lambda: f"cutlassfuse: conv_output must be a floating-point tensor, got {conv_output.dtype}")
    torch._check(grad_output.device == conv_output.device,
                 lambda: f"cutlassfuse: expected all tensors to be on the same device, but found grad_output on "
                         f"{grad_output.device} and input on {conv_output.device}")
    torch._check_value(grad_output.shape == conv_output.shape,
                       lambda: f"cutlassfuse: grad_output must have conv_output's shape {list(conv_output.shape)}, "
                               f"got {list(grad_output.shape)}")
    torch._check_type(grad_output.dtype == conv_output.dtype,
                      lambda: f"cutlassfuse: grad_output must have conv_output's dtype {conv_output.dtype}, got "
                              f"{grad_output.dtype}")
    _norm_fake(conv_output, num_groups, norm_weight, norm_bias, 0.0, activation, activation_parameter,
               activation_weight)
    channels = conv_output.shape[1]
    _check_vector(bias, "bias", channels, conv_output, same_dtype=True)
    _check_statistic(mean, "mean", conv_output.shape[0], num_groups, conv_output)
    _check_statistic(rstd, "rstd", conv_output.shape[0], num_groups, conv_output)
    statistics = _statistics_dtype(conv_output.dtype)
    dz = torch.empty_like(conv_output, memory_format=suggest_memory_format(conv_output))
    slopes = 0 if activation_weight is None else activation_weight.shape[0]
    return dz, *(conv_output.new_empty((size,), dtype=statistics) for size in (channels, channels, channels, slopes))
