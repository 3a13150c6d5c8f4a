"""The backward's two convolution gradients per layer, this project's CUTLASS sm90 kernels
against ATen's convolution_backward (cuDNN), both on channels-last operands as the
backward passes them: the data behind the conv_gradients rule (sm90/conv_gradients.h).

    python benchmarks/conv_gradient_choice.py [--shape gan_k4s2p1 --shape 2,64,32,32,32,32,4,2,1,0,8]
    python benchmarks/conv_gradient_choice.py --dtype bfloat16

Per layer and gradient: the median over alternating rounds of each round's median of
CUDA-event times, the ratio CUTLASS / cuDNN, and each result's max abs error against
float64 (the same operands in float64 through ATen).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cutlassfuse.bench import DEFAULT_SHAPES, parse_shape
from cutlassfuse.benchmarking import median_ms

# Strided and unit-stride layers of 32 to 512 channels beside the benchmark shapes
# (batch, in, out, D, H, W, kernel, stride, padding, output padding, groups).
SWEEP = ["4,128,256,24,24,24,3,1,0,0,16", "2,256,128,48,48,48,3,1,1,0,8", "8,64,128,16,16,16,3,1,1,0,8",
         "1,64,64,32,32,32,5,1,2,0,8", "2,32,64,48,48,48,3,1,0,0,8", "2,64,32,32,32,32,4,2,1,0,8",
         "2,128,64,16,16,16,4,2,1,0,8", "8,256,128,8,8,8,4,2,1,0,8", "1,256,128,16,16,16,6,2,2,0,8",
         "2,512,256,8,8,8,4,2,1,0,32", "2,128,128,16,16,16,3,2,1,1,8", "4,64,64,16,16,16,2,2,0,0,8",
         "2,32,32,32,32,32,4,4,0,0,8", "2,128,64,24,24,24,3,2,0,0,8", "1,128,128,24,24,24,3,3,0,0,8",
         "16,128,64,16,16,16,4,2,1,0,8", "2,64,64,32,32,32,3,2,1,1,8"]
ROUNDS = 5
CHANNELS_LAST = torch.channels_last_3d


def operands(shape, dtype: torch.dtype):
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", generator=generator)
    w = torch.randn(shape.in_channels, shape.out_channels, *(shape.kernel,) * 3, device="cuda", generator=generator)
    dz = torch.randn(shape.batch, shape.out_channels, *shape.output_size(), device="cuda", generator=generator)
    return (x.to(dtype).contiguous(memory_format=CHANNELS_LAST), (w * 0.05).to(dtype),
            dz.to(dtype).contiguous(memory_format=CHANNELS_LAST))


def run_layer(name: str, dtype: torch.dtype) -> None:
    shape = parse_shape(name)
    x, w, dz = operands(shape, dtype)
    geometry = ((shape.stride,) * 3, (shape.padding,) * 3, (shape.output_padding,) * 3, 1, (1, 1, 1))
    stride, padding, output_padding, groups, dilation = geometry

    def aten(index: int, tensors=(dz, x, w)):
        mask = [index == 0, index == 1, False]
        return torch.ops.aten.convolution_backward(*tensors, None, stride, padding, dilation, True, output_padding,
                                                   groups, mask)[index]

    ops = (torch.ops.cutlassfuse.conv_transpose3d_input_grad, torch.ops.cutlassfuse.conv_transpose3d_weight_grad)
    for index, label in enumerate(("input", "weight")):
        exact = aten(index, tuple(t.double() for t in (dz, x, w)))
        candidates = {"cudnn": lambda i=index: aten(i), "cutlass": lambda op=ops[index]: op(dz, x, w, *geometry)}
        errors = {k: (fn().double() - exact).abs().max().item() for k, fn in candidates.items()}
        rounds: dict[str, list[float]] = {k: [] for k in candidates}
        for _ in range(ROUNDS):
            for k, fn in candidates.items():
                rounds[k].append(median_ms(fn, cuda=True, warmup=2, repeats=10))
        ms = {k: statistics.median(v) for k, v in rounds.items()}
        print(f"{name:<32}{label:<8}{ms['cudnn']:>9.3f}{ms['cutlass']:>9.3f}{ms['cutlass'] / ms['cudnn']:>9.2f}"
              f"{errors['cudnn']:>11.2e}{errors['cutlass']:>11.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", action="append", help="a benchmark shape's name or its 11 numbers")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    args = parser.parse_args()
    names = args.shape or [s.name for s in DEFAULT_SHAPES] + SWEEP
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; ms, CUTLASS / cuDNN, "
          "auto's pick, max abs error against float64")
    print(f"{'layer':<32}{'grad':<8}{'cudnn':>9}{'cutlass':>9}{'ratio':>9}{'err cudnn':>11}"
          f"{'err cutl.':>11}")
    for name in names:
        run_layer(name, getattr(torch, args.dtype))


if __name__ == "__main__":
    main()
