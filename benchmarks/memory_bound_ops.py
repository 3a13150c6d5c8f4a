"""cutlassfuse's memory-bound kernels against ATen's and a copy of the output (clone), per
shape, layout and dtype: the median over alternating rounds of each round's median ms
(fresh inputs rotating past L2), the bandwidth of the kernel's reads and write, and whether
its output equals ATen's bit for bit.

- pad: torch.ops.cutlassfuse.replication_pad3d against F.pad(x, pad, mode="replicate"),
  with a causal 3x3x3 convolution's pad; default shapes: the HunyuanVideo decoder's largest
  causal-pad inputs.
- upsample: torch.ops.cutlassfuse.upsample_nearest3d against F.interpolate(x,
  scale_factor=..., mode="nearest"); default shapes: the decoder's upsampling inputs
  (the frames after the first), 2x in time and space, or in space only (--scale 1,2,2).
- bias_add: torch.ops.cutlassfuse.bias_add(x, bias, residual) against ATen's bias add
  after a convolution, then the residual add; default shapes: the decoder's resnet outputs.
  (Its output is rounded once, ATen's twice: "equal" is False where the two roundings
  differ.)
- modulation: torch.ops.cutlassfuse.upsampled_modulation(x, scale, shift, causal, "silu")
  against CogVideoX's spatial norm's modulation and its resnet's SiLU as diffusers writes
  them (the latent's convolutions upsampled, the first frame apart where the frames are odd,
  then multiply, add, SiLU); scale and shift at CogVideoX's latent resolution (3x32x32, or
  the input's where smaller); default shapes: the decoder's norm inputs. (One rounding
  against ATen's three: "equal" is False.)
- rms_norm: torch.ops.cutlassfuse.channel_rms_norm(x, gamma, None, 1e-12 / sqrt(C), True,
  "silu") against Wan's resnet norm and SiLU as diffusers writes them (WanRMS_norm:
  F.normalize of the float32 input over the channels, rounded, times sqrt(C) and gamma;
  then SiLU); default shapes: Wan's decoder's norm inputs of a 4-frame chunk at 256x256
  and its smaller stages. (One rounding against ATen's four: "equal" is False.)

    python benchmarks/memory_bound_ops.py [--ops pad,upsample,bias_add,modulation,rms_norm]
                                          [--shapes 1x128x17x256x256,...]
    python benchmarks/memory_bound_ops.py --device cpu --shapes 1x3x2x5x7   # checks them without a GPU
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

import cutlassfuse  # noqa: F401  (registers torch.ops.cutlassfuse)
from cutlassfuse.__main__ import DTYPES, comma_list, positive_int
from cutlassfuse.bench import rotating_tensors
from cutlassfuse.block_bench import Timed, medians_over_rounds

CAUSAL = [1, 1, 1, 1, 2, 0]  # HunyuanVideoCausalConv3d's pad for a 3x3x3 kernel
LAYOUTS = {"ncdhw": torch.contiguous_format, "channels_last": torch.channels_last_3d}
DEFAULT_SHAPES = {"pad": "1x128x17x256x256,1x512x9x128x128,1x512x5x32x32",
                  "upsample": "1x256x16x128x128,1x512x8x64x64,1x512x4x32x32",
                  "bias_add": "1x128x17x256x256,1x256x17x128x128,1x512x9x64x64",
                  "modulation": "1x128x9x256x256,1x256x9x128x128,1x512x3x32x32",
                  "rms_norm": "1x96x4x256x256,1x192x4x128x128,1x384x2x64x64"}
LATENT = (3, 32, 32)  # CogVideoX's latent frames, height and width at the default benchmark size


def shape_list(text: str) -> list[tuple[int, ...]]:
    shapes = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
    if any(len(shape) != 5 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"shapes are NxCxDxHxW with positive sizes, not {text!r}")
    return shapes


def scale_factors(text: str) -> tuple[int, int, int]:
    factors = tuple(int(n) for n in text.split(","))
    if len(factors) != 3 or min(factors) < 1:
        raise argparse.ArgumentTypeError(f"--scale is three positive integers D,H,W, not {text!r}")
    return factors


def op_calls(op: str, scale: tuple[int, int, int], like: Tensor) -> tuple[Callable, Callable, int]:
    """cutlassfuse's call and ATen's for `op` on inputs like `like`, and how many tensors
    of the input's size each reads."""
    if op == "pad":
        pad = torch.ops.cutlassfuse.replication_pad3d.default
        return (lambda x: pad(x, CAUSAL)), (lambda x: F.pad(x, CAUSAL, mode="replicate")), 1
    if op == "upsample":
        upsample = torch.ops.cutlassfuse.upsample_nearest3d.default
        scales = [float(factor) for factor in scale]  # what F.interpolate passes for scale_factor
        return ((lambda x: upsample(x, [n * f for n, f in zip(x.shape[2:], scale, strict=True)], *scales)),
                (lambda x: F.interpolate(x, scale_factor=scale, mode="nearest")), 1)
    if op == "modulation":
        return modulation_calls(like)
    if op == "rms_norm":
        return rms_norm_calls(like)
    bias_add = torch.ops.cutlassfuse.bias_add.default
    bias, residual = torch.randn_like(like[0, :, 0, 0, 0]), torch.randn_like(like)
    shaped_bias = bias.view(1, -1, 1, 1, 1)
    return (lambda x: bias_add(x, bias, residual)), (lambda x: (x + shaped_bias) + residual), 2


def upsampled(small: Tensor, size: torch.Size, causal: bool) -> Tensor:
    """CogVideoXSpatialNorm3D's upsampling of the latent to the features' size."""
    if not causal:
        return F.interpolate(small, size=size)
    first = F.interpolate(small[:, :, :1], size=(1, *size[1:]))
    return torch.cat([first, F.interpolate(small[:, :, 1:], size=(size[0] - 1, *size[1:]))], dim=2)


def modulation_calls(like: Tensor) -> tuple[Callable, Callable, int]:
    modulation = torch.ops.cutlassfuse.upsampled_modulation.default
    small_size = (*like.shape[:2], *(min(n, m) for n, m in zip(like.shape[2:], LATENT, strict=True)))
    scale, shift = (torch.randn(small_size, dtype=like.dtype, device=like.device)
                    .contiguous(memory_format=torch.channels_last_3d if like.is_contiguous(
                        memory_format=torch.channels_last_3d) and like.shape[1] > 1 else torch.contiguous_format)
                    for _ in range(2))
    causal = like.shape[2] > 1 and like.shape[2] % 2 == 1
    size = like.shape[2:]
    return ((lambda x: modulation(x, scale, shift, causal, "silu", 0.0)),
            (lambda x: F.silu(x * upsampled(scale, size, causal) + upsampled(shift, size, causal))), 1)


def rms_norm_calls(like: Tensor) -> tuple[Callable, Callable, int]:
    rms_norm = torch.ops.cutlassfuse.channel_rms_norm.default
    channels = like.shape[1]
    gamma = 1 + 0.1 * torch.randn(channels, dtype=like.dtype, device=like.device)
    shaped_gamma = gamma.view(-1, 1, 1, 1)
    return ((lambda x: rms_norm(x, gamma, None, 1e-12 / channels**0.5, True, "silu", 0.0)),
            (lambda x: F.silu(F.normalize(x.float(), dim=1).to(x.dtype) * channels**0.5 * shaped_gamma + 0.0)), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=",".join(DEFAULT_SHAPES), type=comma_list(tuple(DEFAULT_SHAPES)))
    parser.add_argument("--shapes", type=shape_list, help="NxCxDxHxW,... (default: each op's shapes above)")
    parser.add_argument("--scale", type=scale_factors, default=(2, 2, 2), help="upsample's D,H,W factors")
    parser.add_argument("--dtypes", default="float16,float32", type=comma_list(DTYPES))
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()

    device = torch.device(args.device)
    print(f"{'op':<12}{'shape':<20}{'dtype':<9}{'layout':<15}{'ours ms':>9}{'ATen ms':>9}{'copy ms':>9}"
          f"{'vs ATen':>9}{'vs copy':>9}{'GB/s':>8}  equal")
    for op in args.ops:
        for shape in args.shapes or shape_list(DEFAULT_SHAPES[op]):
            for dtype in (getattr(torch, name) for name in args.dtypes):
                for layout, memory_format in LAYOUTS.items():
                    inputs = rotating_tensors(shape, dtype, device, memory_format)
                    ours, aten, reads = op_calls(op, args.scale, inputs[0])
                    expected = aten(inputs[0])
                    equal = torch.equal(ours(inputs[0]), expected)
                    outputs = rotating_tensors(tuple(expected.shape), dtype, device, memory_format)
                    calls = {"ours": Timed(ours, inputs), "aten": Timed(aten, inputs),
                             "copy": Timed(torch.clone, outputs)}
                    ms, _ = medians_over_rounds(calls, args.rounds, args.repeats)
                    moved = (reads * inputs[0].numel() + expected.numel()) * expected.element_size()
                    print(f"{op:<12}{'x'.join(map(str, shape)):<20}{str(dtype)[6:]:<9}{layout:<15}{ms['ours']:>9.3f}"
                          f"{ms['aten']:>9.3f}{ms['copy']:>9.3f}{ms['aten'] / ms['ours']:>8.2f}x"
                          f"{ms['ours'] / ms['copy']:>8.2f}x{moved / ms['ours'] / 1e6:>8.0f}  {equal}")
                    del inputs, outputs, expected, ours, aten
                    if device.type == "cuda":
                        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
