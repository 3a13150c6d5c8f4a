"""The functional API of torch.ops.cutlassfuse and its fake (meta) kernel."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch import Tensor
from torch._prims_common import suggest_memory_format

IntOrTriple = int | Sequence[int]

_OP = "cutlassfuse::conv_transpose3d_relu_group_norm"


def _triple(value: IntOrTriple, name: str) -> list[int]:
    if isinstance(value, int):
        return [value] * 3
    values = list(value)
    if len(values) != 3 or not all(isinstance(v, int) for v in values):
        raise ValueError(f"cutlassfuse: {name} must be an int or 3 ints (depth, height, width), got {value!r}")
    return values


def _op_arguments(input, weight, bias, stride, padding, output_padding, groups, dilation,
                  num_groups, norm_weight, norm_bias, eps, packed_weight, packed_bias=None) -> tuple:
    return (input, weight, bias, norm_weight, norm_bias, int(num_groups), float(eps),
            _triple(stride, "stride"), _triple(padding, "padding"),
            _triple(output_padding, "output_padding"), int(groups), _triple(dilation, "dilation"), packed_weight,
            packed_bias)


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
    packed_weight: Tensor | None = None,
    packed_bias: Tensor | None = None,
) -> Tensor:
    """``F.group_norm(F.relu(F.conv_transpose3d(input, weight, bias, stride, padding,
    output_padding, groups, dilation)), num_groups, norm_weight, norm_bias, eps)`` in one op.

    The positional arguments are those of ``torch.nn.functional.conv_transpose3d``; the
    GroupNorm ones are keyword-only (``norm_weight``/``norm_bias`` are GroupNorm's
    affine gamma/beta). Input (N, C_in, D, H, W), weight (C_in, C_out / groups, kD,
    kH, kW). The output has the input's dtype, and is channels_last_3d when the input
    or the weight is, contiguous otherwise (as PyTorch's composite).

    ``packed_weight``, if given, must be ``pack_weight(weight)``, and ``packed_bias``
    ``pack_bias(bias, stride)``: callers that reuse a layer's parameters (the module does)
    pass them to skip re-permuting the weight and re-repeating the bias on every call.
    """
    return torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(
        *_op_arguments(input, weight, bias, stride, padding, output_padding, groups, dilation,
                       num_groups, norm_weight, norm_bias, eps, packed_weight, packed_bias))


def pack_weight(weight: Tensor) -> Tensor:
    """The weight (C_in, C_out, kD, kH, kW) laid out as the tensor-core kernel reads it:
    (C_in, kD, kH, kW, C_out), contiguous."""
    return weight.detach().permute(0, 2, 3, 4, 1).contiguous()


def pack_bias(bias: Tensor, stride: IntOrTriple) -> Tensor:
    """The bias repeated once per block of stride_d * stride_h * stride_w output pixels,
    as the epilogue of a kernel == stride layer's GEMM reads it (its columns are those
    blocks of C_out channels; other layers ignore it)."""
    strides = _triple(stride, "stride")
    return bias.detach().repeat(strides[0] * strides[1] * strides[2])


def set_dgrad_config(name: str | None) -> None:
    """Pins the sm90 kernel's configuration (for benchmarking); None restores the
    heuristic. Names (CTA tile, kernel layer, cluster): "128x128_pingpong",
    "128x64_pingpong", "128x128_pingpong_cluster2x1" (this project's persistent
    ping-pong kernel; the last in clusters of two CTAs along M sharing the filter tile
    through TMA multicast), "128x128_cluster1x1", "128x64_cluster1x1" (CUTLASS's
    non-persistent conv kernel)."""
    torch.ops.cutlassfuse.set_dgrad_config(name or "")


def set_skip_border_taps(enabled: bool) -> None:
    """On (the default), the ping-pong kernel's tiles skip the filter's depth taps that read
    outside the input for every pixel of the tile (a deconvolution's border planes),
    whose K blocks the im2col loads fill with zeros; off runs them too, for measuring
    what skipping saves. The output does not depend on it. No effect on a CPU-only
    build."""
    if hasattr(torch.ops.cutlassfuse, "set_skip_border_taps"):
        torch.ops.cutlassfuse.set_skip_border_taps(bool(enabled))


def set_drawn_tile_schedule(enabled: bool) -> None:
    """On (the default), the CTAs of the ping-pong kernel (clusters of one) take their first
    two tiles statically and draw the rest from a counter as they reach them, so that CTAs
    whose tiles skip more border taps take more tiles; off, each CTA walks a static list
    (every grid-size-th tile), for measuring what drawing saves. The output does not
    depend on it. No effect on a CPU-only build."""
    if hasattr(torch.ops.cutlassfuse, "set_drawn_tile_schedule"):
        torch.ops.cutlassfuse.set_drawn_tile_schedule(bool(enabled))


def set_fused_path_enabled(enabled: bool) -> None:
    """Turns the sm90 fused path off (False) or back on (True) for this process, so
    that CUDA calls take the fallback: for benchmarking the fallback on a Hopper GPU,
    as other GPUs run it. No effect on a CPU-only build."""
    if hasattr(torch.ops.cutlassfuse, "set_fused_path_enabled"):
        torch.ops.cutlassfuse.set_fused_path_enabled(bool(enabled))


def set_float32_tensor_cores(enabled: bool) -> None:
    """Lets float32 calls take the fused sm90 path as three bfloat16 piece products
    (True), about 2x faster than PyTorch's default TF32 convolution and ~10x closer to
    float64, but up to ~7e-4 max abs from float64 after GroupNorm; off by default
    (False), float32 calls run strict fp32 cuDNN, within 1e-4. No effect on a CPU-only build."""
    if hasattr(torch.ops.cutlassfuse, "set_float32_tensor_cores"):
        torch.ops.cutlassfuse.set_float32_tensor_cores(bool(enabled))


def set_phase_streams(lanes: int) -> None:
    """Spreads the sub-pixel phases of one strided call over `lanes` CUDA streams (1, the
    default, to 8), forked from and joined back into the current stream: an experiment
    knob for overlapping one phase's tail with the next. No effect on a CPU-only build."""
    if not 1 <= lanes <= 8:
        raise ValueError(f"cutlassfuse: set_phase_streams takes 1 to 8 streams, got {lanes}")
    if hasattr(torch.ops.cutlassfuse, "set_phase_streams"):
        torch.ops.cutlassfuse.set_phase_streams(int(lanes))


def explain(*args, **kwargs) -> str:
    """Which implementation ``conv_transpose3d_relu_group_norm`` takes for the same
    arguments, and why: ``"fused_sm90: ..."``, ``"fallback: ..., because ..."`` or
    ``"reference: ..., because ..."``."""
    bound = inspect.signature(conv_transpose3d_relu_group_norm).bind(*args, **kwargs)
    bound.apply_defaults()
    return torch.ops.cutlassfuse.explain(*_op_arguments(**bound.arguments))


explain.__signature__ = inspect.signature(conv_transpose3d_relu_group_norm).replace(return_annotation=str)


def transposed_conv_output_size(input_size: Sequence[int], kernel_size: Sequence[int], stride: Sequence[int],
                                padding: Sequence[int], output_padding: Sequence[int],
                                dilation: Sequence[int]) -> list[int]:
    """ConvTranspose3d's output (D, H, W), PyTorch's formula."""
    dims = zip(input_size, kernel_size, stride, padding, output_padding, dilation, strict=True)
    return [(i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, k, s, p, op, d in dims]


@torch.library.register_fake(_OP)
def _conv_transpose3d_relu_group_norm_fake(input, weight, bias, norm_weight, norm_bias, num_groups, eps,
                                           stride, padding, output_padding, groups, dilation, packed_weight=None,
                                           packed_bias=None):
    torch._check(input.dim() == 5, lambda: f"cutlassfuse: input must be 5-D, got {input.dim()}-D")
    torch._check(weight.dim() == 5, lambda: f"cutlassfuse: weight must be 5-D, got {weight.dim()}-D")
    torch._check(weight.shape[0] == input.shape[1],
                 lambda: f"cutlassfuse: weight.shape[0] ({weight.shape[0]}) must equal the input's channels "
                         f"({input.shape[1]})")
    torch._check(all(extent > 0 for extent in input.shape[1:]),
                 lambda: f"cutlassfuse: only the batch of the input may be empty, got shape {tuple(input.shape)}")
    torch._check(all(s > 0 for s in stride) and all(d > 0 for d in dilation) and all(p >= 0 for p in padding),
                 lambda: f"cutlassfuse: stride and dilation must be positive and padding non-negative, got "
                         f"stride={stride}, dilation={dilation}, padding={padding}")
    torch._check(all(k > 0 for k in weight.shape[2:]) and weight.shape[1] > 0,
                 lambda: f"cutlassfuse: kernel size and output channels must be positive, got weight shape "
                         f"{tuple(weight.shape)}")
    torch._check(eps >= 0, lambda: f"cutlassfuse: eps must be non-negative, got {eps}")
    torch._check(groups > 0 and input.shape[1] % groups == 0,
                 lambda: f"cutlassfuse: input channels ({input.shape[1]}) must be divisible by groups ({groups})")
    out_channels = weight.shape[1] * groups
    torch._check(num_groups > 0 and out_channels % num_groups == 0,
                 lambda: f"cutlassfuse: num_groups ({num_groups}) must be positive and divide the output channels "
                         f"({out_channels})")
    for s, d, op in zip(stride, dilation, output_padding, strict=True):
        torch._check(op < s or op < d,
                     lambda: f"cutlassfuse: output_padding must be smaller than either stride or dilation, got "
                             f"output_padding={output_padding}, stride={stride}, dilation={dilation}")
    spatial = transposed_conv_output_size(input.shape[2:], weight.shape[2:], stride, padding, output_padding,
                                          dilation)
    torch._check(all(extent > 0 for extent in spatial),
                 lambda: f"cutlassfuse: the output would be empty (spatial size {spatial})")
    channels_last = torch.channels_last_3d in (suggest_memory_format(input), suggest_memory_format(weight))
    return torch.empty((input.shape[0], out_channels, *spatial), dtype=input.dtype, device=input.device,
                       memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
