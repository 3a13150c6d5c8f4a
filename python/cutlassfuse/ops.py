"""The functional API of torch.ops.cutlassfuse and its fake (meta) kernel."""

from __future__ import annotations

import contextlib
import inspect
import math
import warnings
from collections.abc import Iterator, Sequence

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

IntOrTriple = int | Sequence[int]

_OP = "cutlassfuse::conv_transpose3d_relu_group_norm"
_OP_FOR_BACKWARD = "cutlassfuse::conv_transpose3d_relu_group_norm_for_backward"
_BACKWARD = "cutlassfuse::relu_group_norm_backward"
_CONVERT_MEMORY_FORMAT = "cutlassfuse::convert_memory_format"
_INPUT_GRAD = "cutlassfuse::conv_transpose3d_input_grad"
_WEIGHT_GRAD = "cutlassfuse::conv_transpose3d_weight_grad"


_INT64_MAX = 2**63 - 1


def _int64(value: int, name: str) -> int:
    """`value`, which the schema's int arguments take only within int64's range."""
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"cutlassfuse: {name} must lie within int64's range, got {value}")
    return value


def _triple(value: IntOrTriple, name: str) -> list[int]:
    values = [value] * 3 if isinstance(value, int) else list(value)
    if len(values) != 3 or not all(isinstance(v, int) for v in values):
        raise ValueError(f"cutlassfuse: {name} must be an int or 3 ints (depth, height, width), got {value!r}")
    return [_int64(v, name) for v in values]


def _op_arguments(input, weight, bias, stride, padding, output_padding, groups, dilation,
                  num_groups, norm_weight, norm_bias, eps, packed_weight=None, packed_bias=None) -> tuple:
    """The op's positional arguments. ``packed_weight``/``packed_bias`` are the schema's
    last two: ``_pack_weight(weight)`` and ``_pack_bias(bias, stride)``, which the module
    passes from its cache (the kernels then read them instead of the weight and the bias:
    they must be those tensors' current values)."""
    return (input, weight, bias, norm_weight, norm_bias, _int64(int(num_groups), "num_groups"), float(eps),
            _triple(stride, "stride"), _triple(padding, "padding"),
            _triple(output_padding, "output_padding"), _int64(int(groups), "groups"), _triple(dilation, "dilation"),
            packed_weight, packed_bias)


def conv_transpose3d_relu_group_norm(
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
) -> Tensor:
    """``F.group_norm(F.relu(F.conv_transpose3d(input, weight, bias, stride, padding,
    output_padding, groups, dilation)), num_groups, norm_weight, norm_bias, eps)`` in one op.

    The positional arguments are those of ``torch.nn.functional.conv_transpose3d``; the
    GroupNorm ones are keyword-only (``norm_weight``/``norm_bias`` are GroupNorm's
    affine gamma/beta). Input (N, C_in, D, H, W), weight (C_in, C_out / groups, kD,
    kH, kW). The output has the input's dtype, and is channels_last_3d when the input
    or the weight is, contiguous otherwise (as PyTorch's composite).
    """
    return torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(
        *_op_arguments(input, weight, bias, stride, padding, output_padding, groups, dilation,
                       num_groups, norm_weight, norm_bias, eps))


def _pack_weight(weight: Tensor) -> Tensor:
    """The weight (C_in, C_out, kD, kH, kW) laid out as the tensor-core kernel reads it:
    (C_in, kD, kH, kW, C_out), contiguous."""
    return weight.detach().permute(0, 2, 3, 4, 1).contiguous()


def _pack_bias(bias: Tensor, stride: IntOrTriple) -> Tensor:
    """The bias repeated once per block of stride_d * stride_h * stride_w output pixels,
    as the epilogue of a kernel == stride layer's GEMM reads it (its columns are those
    blocks of C_out channels; other layers ignore it)."""
    strides = _triple(stride, "stride")
    return bias.detach().repeat(strides[0] * strides[1] * strides[2])


def set_float32_mode(mode: str) -> None:
    """How float32 calls compute the convolution, for this process:

    - ``"pytorch"`` (the default): as PyTorch runs it under its current switches, TF32
      where ``torch.backends.cudnn.allow_tf32`` (its conv switch) allows it, strict fp32
      otherwise, deterministic and benchmark as set; then cutlassfuse's bias + ReLU +
      GroupNorm kernels. The convolution is the ATen call ``nn.ConvTranspose3d`` makes, so
      the op is a drop-in for the float32 modules it replaces.
    - ``"tf32"``: the fused sm90 tensor-core path at TF32's precision: input and filter
      rounded to nearest with TF32's 11-bit significands (as PyTorch's TF32 convolutions
      round them), products summed in fp32. It runs on float16 tensor cores, twice
      TF32's rate: each operand is scaled by a power of two that puts its largest
      magnitude near float16's top before the rounding, and the sums are scaled back, so
      the products are TF32's for every value within 2^28 of its tensor's largest (the
      rest, far below TF32's own rounding error, round to float16's subnormal steps).
      The fastest float32 mode, with an error against float64 of PyTorch's TF32 order;
      not bitwise PyTorch's (another summation order). Other GPUs run ``"pytorch"``.
    - ``"bf16x3"``: the fused sm90 tensor-core path with each float32 operand split into
      bfloat16 pieces (three products summed in fp32): 2.3x faster than PyTorch's TF32 on
      kb61, about its speed on gan_k4s2p1; within ~7e-4 of float64 after GroupNorm
      (PyTorch's TF32 lands ~3e-3 away, its strict fp32 ~1e-5). Other GPUs run
      ``"pytorch"``.
    """
    torch.ops.cutlassfuse.set_float32_mode(mode)


def get_float32_mode() -> str:
    """The float32 mode of this process (``set_float32_mode``)."""
    return torch.ops.cutlassfuse.float32_mode()


@contextlib.contextmanager
def float32_mode(mode: str) -> Iterator[None]:
    """``set_float32_mode(mode)`` inside the ``with`` block; the previous mode after it."""
    previous = get_float32_mode()
    set_float32_mode(mode)
    try:
        yield
    finally:
        set_float32_mode(previous)


def set_float32_tensor_cores(enabled: bool) -> None:
    """Deprecated: ``set_float32_mode("bf16x3")`` when True, ``set_float32_mode("pytorch")``
    when False, with a ``FutureWarning`` (PyTorch's category for deprecated user-facing
    APIs, shown by default). Call ``set_float32_mode`` instead."""
    mode = "bf16x3" if enabled else "pytorch"
    warnings.warn(f"cutlassfuse.set_float32_tensor_cores({enabled}) is deprecated; use "
                  f"cutlassfuse.set_float32_mode({mode!r}) instead", FutureWarning, stacklevel=2)
    set_float32_mode(mode)


def explain(*args, **kwargs) -> str:
    """Which implementation ``conv_transpose3d_relu_group_norm`` takes for the same
    arguments in the current grad mode, and why: ``"fused_sm90: ..."``, ``"fallback:
    ..., because ..."`` or ``"reference: ..., because ..."``. A call in grad mode on
    tensors that require grad keeps what its backward reads: the description then says
    what it keeps and which launch writes it."""
    bound = inspect.signature(conv_transpose3d_relu_group_norm).bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = bound.arguments
    differentiable = [arguments[name] for name in ("input", "weight", "bias", "norm_weight", "norm_bias")]
    op = torch.ops.cutlassfuse.explain_for_backward if _tracked(differentiable) else torch.ops.cutlassfuse.explain
    return op(*_op_arguments(**arguments))


def _tracked(tensors) -> bool:
    """Whether a call on ``tensors`` (its differentiable ones, None where absent) in the
    current grad mode is differentiated, and so keeps what its backward reads."""
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


explain.__signature__ = inspect.signature(conv_transpose3d_relu_group_norm).replace(return_annotation=str)


def transposed_conv_output_size(input_size: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                                padding: Sequence[int], output_padding: Sequence[int],
                                dilation: Sequence[int]) -> list[int]:
    """ConvTranspose3d's output (D, H, W), PyTorch's formula."""
    dims = zip(input_size, kernel_size, stride, padding, output_padding, dilation, strict=True)
    return [(i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, k, s, p, op, d in dims]


def _check_vector(tensor: Tensor | None, name: str, size, input: Tensor, same_dtype: bool) -> None:
    if tensor is None:
        return
    torch._check_value(tensor.dim() == 1 and tensor.shape[0] == size,
                       lambda: f"cutlassfuse: {name} must have shape ({size},), got {tuple(tensor.shape)}")
    torch._check_type(tensor.dtype.is_floating_point,
                      lambda: f"cutlassfuse: {name} must be a floating-point tensor, got {tensor.dtype}")
    torch._check_type(not same_dtype or tensor.dtype == input.dtype,
                      lambda: f"cutlassfuse: {name} must have the input's dtype {input.dtype}, got {tensor.dtype}")


@torch.library.register_fake(_OP)
def _conv_transpose3d_relu_group_norm_fake(input, weight, bias, norm_weight, norm_bias, num_groups, eps,
                                           stride, padding, output_padding, groups, dilation, packed_weight=None,
                                           packed_bias=None):
    """The op's output without computing it (the Meta kernel, and torch.compile's fake
    tensors). The same checks, exception kinds and messages as the C++ validation."""
    torch._check_value(input.dim() == 5, lambda: f"cutlassfuse: input must be 5-D (N, C_in, D, H, W), got "
                                                 f"{input.dim()}-D with shape {tuple(input.shape)}")
    torch._check_value(weight.dim() == 5, lambda: f"cutlassfuse: weight must be 5-D (C_in, C_out / groups, kD, kH, "
                                                  f"kW), got {weight.dim()}-D with shape {tuple(weight.shape)}")
    torch._check_type(input.dtype.is_floating_point,
                      lambda: f"cutlassfuse: input must be a floating-point tensor, got {input.dtype}")
    torch._check_type(weight.dtype == input.dtype,
                      lambda: f"cutlassfuse: weight dtype {weight.dtype} differs from input dtype {input.dtype}")
    named = {"weight": weight, "bias": bias, "norm_weight": norm_weight, "norm_bias": norm_bias,
             "packed_weight": packed_weight, "packed_bias": packed_bias}
    for name, tensor in named.items():
        if tensor is not None:
            torch._check(tensor.device == input.device,
                         lambda: f"cutlassfuse: expected all tensors to be on the same device, but found {name} on "
                                 f"{tensor.device} and input on {input.device}")
    torch._check_value(groups > 0, lambda: f"cutlassfuse: groups must be positive, got {groups}")
    torch._check_value(all(s > 0 for s in stride), lambda: f"cutlassfuse: stride must be positive, got {stride}")
    torch._check_value(all(d > 0 for d in dilation), lambda: f"cutlassfuse: dilation must be positive, got {dilation}")
    torch._check_value(all(p >= 0 for p in padding),
                       lambda: f"cutlassfuse: padding must be non-negative, got {padding}")
    torch._check_value(all(0 <= op and (op < s or op < d) for s, d, op in zip(stride, dilation, output_padding,
                                                                               strict=True)),
                       lambda: f"cutlassfuse: output_padding must be smaller than either stride or dilation, got "
                               f"output_padding={output_padding}, stride={stride}, dilation={dilation}")
    torch._check_value(weight.shape[0] == input.shape[1],
                       lambda: f"cutlassfuse: weight.shape[0] ({weight.shape[0]}) must equal the input's channels "
                               f"({input.shape[1]})")
    torch._check_value(all(extent > 0 for extent in input.shape[1:]),
                       lambda: f"cutlassfuse: only the batch of the input may be empty, got shape {tuple(input.shape)}")
    torch._check_value(input.shape[1] % groups == 0,
                       lambda: f"cutlassfuse: input channels ({input.shape[1]}) must be divisible by groups ({groups})")
    torch._check_value(all(k > 0 for k in weight.shape[2:]),
                       lambda: f"cutlassfuse: kernel size must be positive, got weight shape {tuple(weight.shape)}")
    spatial = transposed_conv_output_size(input.shape[2:], weight.shape[2:], stride, padding, output_padding,
                                          dilation)
    torch._check_value(all(extent > 0 for extent in spatial),
                       lambda: f"cutlassfuse: the output would be empty (spatial size {spatial})")
    out_channels = weight.shape[1] * groups
    torch._check_value(out_channels > 0, lambda: "cutlassfuse: weight gives zero output channels")
    # PyTorch's bound on a tensor's storage, 2^63 - 1 bytes, with at least one sample (so
    # that the output's strides fit too), as the C++ validation checks it.
    output_bytes = torch.sym_max(input.shape[0], 1) * out_channels * math.prod(spatial) * input.element_size()
    torch._check_value(output_bytes <= _INT64_MAX,
                       lambda: f"cutlassfuse: the output size overflows: input {list(input.shape)}, weight "
                               f"{list(weight.shape)}, stride {stride}, padding {padding}, output_padding "
                               f"{output_padding} and dilation {dilation} give an output of more than 2^63 - 1 bytes "
                               f"(PyTorch's limit on a tensor's storage)")
    torch._check_value(num_groups > 0 and out_channels % num_groups == 0,
                       lambda: f"cutlassfuse: num_groups ({num_groups}) must be positive and divide the output "
                               f"channels ({out_channels})")
    torch._check_value(math.isfinite(eps) and eps >= 0,
                       lambda: f"cutlassfuse: eps must be finite and non-negative, got {eps}")
    _check_vector(bias, "bias", out_channels, input, same_dtype=True)
    _check_vector(norm_weight, "norm_weight", out_channels, input, same_dtype=False)
    _check_vector(norm_bias, "norm_bias", out_channels, input, same_dtype=False)
    if packed_weight is not None:
        expected = (weight.shape[0], *weight.shape[2:], weight.shape[1])
        torch._check_value(tuple(packed_weight.shape) == expected,
                           lambda: f"cutlassfuse: packed_weight must be weight.permute(0, 2, 3, 4, 1), shape "
                                   f"{expected}, got {tuple(packed_weight.shape)}")
        torch._check_type(packed_weight.dtype == weight.dtype,
                          lambda: f"cutlassfuse: packed_weight must have the weight's dtype {weight.dtype}, got "
                                  f"{packed_weight.dtype}")
    if packed_bias is not None:
        torch._check_value(bias is not None, lambda: "cutlassfuse: packed_bias given without a bias")
        values = stride[0] * stride[1] * stride[2] * out_channels
        torch._check_value(packed_bias.dim() == 1 and packed_bias.shape[0] == values,
                           lambda: f"cutlassfuse: packed_bias must be bias.repeat(prod(stride)), {values} contiguous "
                                   f"values, got shape {tuple(packed_bias.shape)}")
        torch._check_type(packed_bias.dtype == bias.dtype,
                          lambda: f"cutlassfuse: packed_bias must have the bias's dtype {bias.dtype}, got "
                                  f"{packed_bias.dtype}")
    channels_last = torch.channels_last_3d in (suggest_memory_format(input), suggest_memory_format(weight))
    return torch.empty((input.shape[0], out_channels, *spatial), dtype=input.dtype, device=input.device,
                       memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)


def _is_pixel_shuffle_gemm(weight, stride, padding, output_padding, groups, dilation) -> bool:
    """kernel_size == stride > 1 with no padding, output padding or dilation, one group."""
    return (groups == 1 and tuple(weight.shape[2:]) == tuple(stride) and math.prod(stride) > 1
            and not any(padding) and not any(output_padding) and all(d == 1 for d in dilation))


@torch.library.register_fake(_OP_FOR_BACKWARD)
def _for_backward_fake(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                       output_padding, groups, dilation, packed_weight=None, packed_bias=None, keep_conv_output=False,
                       keep_space_to_depth=False):
    """The op's output, and what its backward reads: the activation (channels_last_3d, the
    op's dtype), with ``keep_conv_output`` the convolution's output without bias (the
    output's memory format), with ``keep_space_to_depth`` the activation in the
    pixel-shuffle GEMM's order ([batch, D, H, W, stride_d, stride_h, stride_w, channels]
    over the input's D, H, W, contiguous), and GroupNorm's mean and rstd ([batch,
    num_groups], float64 for float64 calls, else float32)."""
    out = _conv_transpose3d_relu_group_norm_fake(input, weight, bias, norm_weight, norm_bias, num_groups, eps,
                                                 stride, padding, output_padding, groups, dilation, packed_weight,
                                                 packed_bias)
    if keep_conv_output and keep_space_to_depth:
        raise ValueError("cutlassfuse: keep_conv_output and keep_space_to_depth name two different kept tensors; "
                         "set one")
    if keep_space_to_depth:
        if not _is_pixel_shuffle_gemm(weight, stride, padding, output_padding, groups, dilation):
            raise ValueError("cutlassfuse: keep_space_to_depth needs a layer whose kernel_size equals its stride "
                             "(above 1), with no padding, output_padding or dilation and groups=1 (the pixel-shuffle "
                             "GEMM's layers)")
        kept = out.new_empty((input.shape[0], *input.shape[2:], *stride, out.shape[1]))
    elif keep_conv_output:
        kept = torch.empty_like(out)
    else:
        kept = torch.empty(out.shape, dtype=out.dtype, device=out.device, memory_format=torch.channels_last_3d)
    statistics = out.new_empty((out.shape[0], num_groups), dtype=_statistics_dtype(out.dtype))
    return out, kept, statistics, statistics.clone()


@torch.library.register_fake(_BACKWARD)
def _relu_group_norm_backward_fake(grad_output, activation, mean, rstd, norm_weight, num_groups):
    """The gradients of the convolution's output (grad_output's shape, channels_last_3d,
    the activation's dtype), gamma, beta and the convolution's bias ([channels] each,
    float64 for float64 activations, else float32). The activation is (N, C, D, H, W), or
    the forward's space-to-depth kept tensor (N, D, H, W, sD, sH, sW, C)."""
    channels = activation.shape[-1] if activation.dim() == 8 else activation.shape[1]
    dz = torch.empty(grad_output.shape, dtype=activation.dtype, device=activation.device,
                     memory_format=torch.channels_last_3d)
    return dz, *(activation.new_empty((channels,), dtype=_statistics_dtype(activation.dtype)) for _ in range(3))


@torch.library.register_fake(_CONVERT_MEMORY_FORMAT)
def _convert_memory_format_fake(self, channels_last):
    """A new tensor like self in channels_last_3d or the contiguous format."""
    return torch.empty_like(self, memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)


@torch.library.register_fake(_INPUT_GRAD)
def _input_grad_fake(grad_output, input, weight, stride, padding, output_padding, groups, dilation):
    """The transposed convolution's input gradient: like the input, channels_last_3d."""
    return torch.empty_like(input, memory_format=torch.channels_last_3d)


@torch.library.register_fake(_WEIGHT_GRAD)
def _weight_grad_fake(grad_output, input, weight, stride, padding, output_padding, groups, dilation):
    """The transposed convolution's weight gradient: like the weight, channels_last_3d."""
    return torch.empty_like(weight, memory_format=torch.channels_last_3d)


def _statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    """GroupNorm's accumulation type."""
    return torch.float64 if dtype == torch.float64 else torch.float32
