"""Helpers to check cutlassfuse: random arguments for the op, float64 references (PyTorch's
ops, and one from the definitions alone) and error metrics."""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .info import info
from .ops import _op_arguments, _pack_bias, _pack_weight, conv_transpose3d_relu_group_norm, transposed_conv_output_size

# Accepted error of the op against float64, per dtype: relative error is
# ||out - ref|| / ||ref||. Half precision rounds the conv output and the result
# (2^-11); bfloat16 has 8 bits of mantissa (2^-8).
RELATIVE_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}


def fused_path_expected() -> bool:
    """Whether calls the fused path takes run it here: a Hopper GPU (sm_90) and a build
    with the CUDA kernels. Elsewhere they run the CUDA fallback."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and info()["cuda_kernels"]


IntOrTriple = int | Sequence[int]


def _triple(value: IntOrTriple) -> tuple[int, int, int]:
    return (value,) * 3 if isinstance(value, int) else tuple(value)


def make_inputs(*, batch: int, in_channels: int, out_channels: int, size: IntOrTriple, kernel: IntOrTriple,
                num_groups: int, stride: IntOrTriple = 1, padding: IntOrTriple = 0, output_padding: IntOrTriple = 0,
                dilation: IntOrTriple = 1, groups: int = 1, bias: bool = True, affine: bool = True,
                eps: float = 1e-5, channels_last: bool = False, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", seed: int = 0, requires_grad: bool = False) -> dict:
    """Random arguments of one call of the op, as the keywords of
    ``conv_transpose3d_relu_group_norm`` (also those of ``explain`` and ``reference_float64``).

    The input is N(0, 1); the weight (in_channels, out_channels / groups, *kernel) is
    N(0, 1 / fan_in), fan_in the input channels of one conv group times the kernel volume,
    so that the convolution's output is of order one on any layer; the bias N(0, 0.2^2);
    GroupNorm's gamma 1 + N(0, 0.2^2) and beta N(0, 0.2^2). ``bias``/``affine`` False give
    None instead. Drawn in float32 from a generator on `device` seeded with `seed`, then
    cast to `dtype`; ``channels_last`` lays the input out channels_last_3d;
    ``requires_grad`` makes every tensor a leaf that wants its gradient."""
    device = torch.device(device)
    generator = torch.Generator(device=device).manual_seed(seed)
    kernel = _triple(kernel)
    fan_in = in_channels // groups * kernel[0] * kernel[1] * kernel[2]

    def randn(*shape: int, scale: float = 1.0, offset: float = 0.0) -> Tensor:
        return (torch.randn(*shape, generator=generator, device=device) * scale + offset).to(dtype)

    x = randn(batch, in_channels, *_triple(size))
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    inputs = dict(
        input=x, weight=randn(in_channels, out_channels // groups, *kernel, scale=fan_in**-0.5),
        bias=randn(out_channels, scale=0.2) if bias else None, stride=stride, padding=padding,
        output_padding=output_padding, groups=groups, dilation=dilation, num_groups=num_groups,
        norm_weight=randn(out_channels, scale=0.2, offset=1.0) if affine else None,
        norm_bias=randn(out_channels, scale=0.2) if affine else None, eps=eps)
    for value in inputs.values():
        if isinstance(value, Tensor):
            value.requires_grad_(requires_grad)
    return inputs


def _float64(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(torch.float64)


def reference_float64(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                      output_padding=0, groups: int = 1, dilation=1, *, num_groups: int,
                      norm_weight: Tensor | None = None, norm_bias: Tensor | None = None,
                      eps: float = 1e-5) -> Tensor:
    """GroupNorm(ReLU(ConvTranspose3d)) with PyTorch's ops in float64 on the inputs' device."""
    y = F.conv_transpose3d(_float64(input), _float64(weight), _float64(bias), stride, padding, output_padding,
                           groups, dilation)
    # torch.group_norm, not F.group_norm: the functional refuses groups of one element
    # ("more than 1 value per channel when training"), which the op normalizes to beta.
    return torch.group_norm(F.relu(y), num_groups, _float64(norm_weight), _float64(norm_bias), eps)


def reference_by_definition(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrTriple = 1,
                            padding: IntOrTriple = 0, output_padding: IntOrTriple = 0, groups: int = 1,
                            dilation: IntOrTriple = 1, *, num_groups: int, norm_weight: Tensor | None = None,
                            norm_bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """GroupNorm(ReLU(ConvTranspose3d)) in float64 from the definitions, with none of
    PyTorch's convolution or normalization kernels: input pixel i adds x[i] * w[t] to
    output pixel i * stride + t * dilation - padding, for every filter tap t (summed over
    the input channels of its conv group), then each (sample, group) is shifted by its
    mean and divided by sqrt(biased variance + eps). A loop over the taps: small shapes
    only."""
    x, w = _float64(input), _float64(weight)
    stride, padding, output_padding, dilation = map(_triple, (stride, padding, output_padding, dilation))
    batch, in_channels, *size = x.shape
    per_group, kernel = w.shape[1], tuple(w.shape[2:])
    out_channels = per_group * groups
    out_size = transposed_conv_output_size(size, kernel, stride, padding, output_padding, dilation)
    # Output pixels before the padding is cropped: every tap's reach, and the cropped window.
    full = [max((i - 1) * s + d * (k - 1) + 1, p + o)
            for i, s, d, k, p, o in zip(size, stride, dilation, kernel, padding, out_size, strict=True)]
    y = x.new_zeros(batch, groups, per_group, *full)
    x_by_group = x.reshape(batch, groups, in_channels // groups, *size)
    w_by_group = w.reshape(groups, in_channels // groups, per_group, *kernel)
    for tap in itertools.product(*(range(k) for k in kernel)):
        products = torch.einsum("ngcdhw,gco->ngodhw", x_by_group, w_by_group[(..., *tap)])
        reached = tuple(slice(t * d, t * d + (i - 1) * s + 1, s)
                        for t, d, i, s in zip(tap, dilation, size, stride, strict=True))
        y[(slice(None), slice(None), slice(None), *reached)] += products
    window = tuple(slice(p, p + o) for p, o in zip(padding, out_size, strict=True))
    y = y.reshape(batch, out_channels, *full)[(slice(None), slice(None), *window)]
    if bias is not None:
        y = y + _float64(bias).view(1, -1, 1, 1, 1)
    y = torch.where(y < 0, torch.zeros_like(y), y)  # ReLU; NaN stays NaN
    per_norm_group = out_channels // num_groups * out_size[0] * out_size[1] * out_size[2]
    values = y.reshape(batch, num_groups, per_norm_group)
    mean = values.sum(dim=2, keepdim=True) / per_norm_group
    variance = ((values - mean) ** 2).sum(dim=2, keepdim=True) / per_norm_group
    out = ((values - mean) / torch.sqrt(variance + eps)).reshape(batch, out_channels, *out_size)
    if norm_weight is not None:
        out = out * _float64(norm_weight).view(1, -1, 1, 1, 1)
    if norm_bias is not None:
        out = out + _float64(norm_bias).view(1, -1, 1, 1, 1)
    return out


def norm_activation_backward_by_autograd(grad_output: Tensor, conv_output: Tensor, bias: Tensor | None,
                                         norm_weight: Tensor | None, norm_bias: Tensor | None, num_groups: int,
                                         eps: float, activation: torch.nn.Module,
                                         activation_before_norm: bool) -> tuple[tuple[Tensor, Tensor], list[Tensor]]:
    """What ``torch.ops.cutlassfuse.norm_activation_backward`` reads and returns, by
    autograd through torch.group_norm and `activation` (a torch.nn module) in the
    tensors' dtype: (mean, rstd) of the norm's input (computed in float64, returned in the
    op's statistics dtype), and the gradients of conv_output, gamma, beta, the bias
    (those of ones, zeros and zeros where they are None) and the activation's weight (an
    empty tensor where it has none)."""
    channels = conv_output.shape[1]

    def leaf(t: Tensor | None, fill: float) -> Tensor:
        return (conv_output.new_full((channels,), fill) if t is None else t).detach().requires_grad_()

    y = conv_output.detach().requires_grad_()
    gamma, beta, b = leaf(norm_weight, 1.0), leaf(norm_bias, 0.0), leaf(bias, 0.0)
    activation = copy.deepcopy(activation)  # its weight's gradient of its own
    z = y + b.view(1, -1, 1, 1, 1)
    x = activation(z) if activation_before_norm else z
    values = x.detach().to(torch.float64).reshape(x.shape[0], num_groups, -1)
    statistics = torch.float64 if conv_output.dtype == torch.float64 else torch.float32
    mean = values.mean(-1).to(statistics)
    rstd = (values.var(-1, unbiased=False) + eps).rsqrt().to(statistics)
    out = torch.group_norm(x, num_groups, gamma, beta, eps)
    if not activation_before_norm:
        out = activation(out)
    weights = list(activation.parameters())
    grads = torch.autograd.grad(out, [y, gamma, beta, b, *weights], grad_output)
    return (mean, rstd), [*grads[:4], grads[4] if weights else conv_output.new_empty((0,))]


_PACKED = ("packed_weight", "packed_bias")


def op_arguments(inputs: dict) -> tuple:
    """The registered op's positional arguments (``torch.ops.cutlassfuse.
    conv_transpose3d_relu_group_norm``, ``torch.library.opcheck``) for keyword arguments
    of the functional op, such as ``make_inputs`` gives, plus the op's own
    ``packed_weight`` and ``packed_bias`` where `inputs` has them (``packed_operands``)."""
    bound = inspect.signature(conv_transpose3d_relu_group_norm).bind(
        **{name: value for name, value in inputs.items() if name not in _PACKED})
    bound.apply_defaults()
    return _op_arguments(**bound.arguments, **{name: inputs[name] for name in _PACKED if name in inputs})


def packed_operands(inputs: dict) -> dict:
    """The packed weight and bias a module passes the op for these arguments (the
    kernels read them instead of the weight and the bias), as ``op_arguments`` takes them."""
    bias = inputs.get("bias")
    return dict(packed_weight=_pack_weight(inputs["weight"]),
                packed_bias=None if bias is None else _pack_bias(bias, inputs.get("stride", 1)))


def device_operations(fn) -> list[str]:
    """Names of the kernels, copies and memsets one call of ``fn`` runs on the GPU (after
    a first call, which may set things up)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def poison_cuda_allocator(nbytes: int) -> None:
    """Leaves NaN in the CUDA caching allocator's free memory, so that an element an op
    allocates but fails to write reads back as NaN rather than as stale plausible data.

    The allocator serves requests above 1 MiB from its large pool and smaller ones from
    2 MiB segments of its small pool: cached free blocks are released first, then one
    free NaN block of at least `nbytes` is left in the large pool and one whole NaN
    segment in the small pool, which the next allocations split. Segments that live
    tensors keep (a library's workspace, a generator's state) cannot be released, and the
    allocator serves a request from the smallest free block that fits: every free block
    left in them is filled too. All bytes 0xFF: NaN in float16, bfloat16 and float32."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    small_block = 1 << 20  # the largest request the small pool serves

    def poisoned(size: int) -> torch.Tensor:
        return torch.full((size,), 0xFF, dtype=torch.uint8, device="cuda")

    held = [poisoned(max(nbytes, 2 * small_block) + 2), poisoned(small_block), poisoned(small_block)]
    device = torch.cuda.current_device()
    for segment in torch.cuda.memory_snapshot():
        if segment["device"] != device:
            continue
        held += [poisoned(block["size"]) for block in segment["blocks"] if block["state"] == "inactive"]
    del held


@dataclass(frozen=True)
class Errors:
    relative: float  # ||out - ref||_2 / ||ref||_2
    max_abs: float

    def __str__(self) -> str:
        return f"rel {self.relative:.2e}, max abs {self.max_abs:.2e}"


def errors(actual: Tensor, expected: Tensor) -> Errors:
    """Errors of `actual` against `expected`, computed in float64. NaN anywhere gives NaN."""
    diff = actual.to(torch.float64) - expected.to(torch.float64)
    return Errors(relative=(diff.norm() / expected.to(torch.float64).norm()).item(),
                  max_abs=diff.abs().max().item())


class KernelBenchModel(torch.nn.Module):
    """KernelBench level2/61's original ``Model``: the three PyTorch modules in a row."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, groups: int, bias: bool = False):
        super().__init__()
        self.conv_transpose = torch.nn.ConvTranspose3d(in_channels, out_channels, kernel_size, bias=bias)
        self.relu = torch.nn.ReLU()
        self.group_norm = torch.nn.GroupNorm(num_groups=groups, num_channels=out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.group_norm(self.relu(self.conv_transpose(x)))


# A torch.nn module computing each of the block family's activations (cutlassfuse.blocks.
# ACTIVATIONS) for `c` channels, with constants away from their defaults; "prelu_shared":
# PReLU with one slope for every channel (nn.PReLU's default).
ACTIVATION_MODULES = {
    "identity": lambda c: torch.nn.Identity(),
    "relu": lambda c: torch.nn.ReLU(),
    "leaky_relu": lambda c: torch.nn.LeakyReLU(0.1),
    "prelu": lambda c: torch.nn.PReLU(c, init=0.2),
    "silu": lambda c: torch.nn.SiLU(),
    "gelu": lambda c: torch.nn.GELU(),
    "gelu_tanh": lambda c: torch.nn.GELU(approximate="tanh"),
    "elu": lambda c: torch.nn.ELU(0.7),
    "prelu_shared": lambda c: torch.nn.PReLU(1, init=0.2),
}
