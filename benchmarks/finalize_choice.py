"""Where the GroupNorm statistics are finalized, timed per call: by the deconvolution
kernel after its last tile (set_cooperative_finalize(True): a cooperative launch)
against the first blocks of the finishing kernel (the default), two kernels per call
either way, on every baselines.md shape, module calls on NCDHW input.

    python benchmarks/finalize_choice.py [--dtype float16] [--rounds 5]

Eager calls (host included) and CUDA graph replay (GPU time alone), medians of CUDA
events around each call; the two choices alternate round by round in one process, so
clock and thermal drift fall on both.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import cutlassfuse
from cutlassfuse.bench import DEFAULT_SHAPES
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.modules import ConvTranspose3dReLUGroupNorm

CHOICES = {"in conv": True, "finish kernel": False}


def graph_of(fn) -> torch.cuda.CUDAGraph:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()  # packed parameters and allocator warmed outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"GPU: {torch.cuda.get_device_name()}, {args.dtype}, us per call (median of {args.rounds} rounds)")
    print(f"{'shape':15s} {'eager in conv':>14s} {'eager kernel':>13s} {'ratio':>6s} "
          f"{'graph in conv':>14s} {'graph kernel':>13s} {'ratio':>6s}")
    for shape in DEFAULT_SHAPES:
        layer = ConvTranspose3dReLUGroupNorm(shape.in_channels, shape.out_channels, shape.kernel, shape.groups,
                                             bias=True, stride=shape.stride, padding=shape.padding,
                                             output_padding=shape.output_padding, device="cuda", dtype=dtype)
        x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
        eager = {name: [] for name in CHOICES}
        replay = {name: [] for name in CHOICES}
        for _ in range(args.rounds):
            for name, enabled in CHOICES.items():
                cutlassfuse.set_cooperative_finalize(enabled)
                eager[name].append(1e3 * median_ms(lambda: layer(x), cuda=True, warmup=10, repeats=50))
                graph = graph_of(lambda: layer(x))
                replay[name].append(1e3 * median_ms(graph.replay, cuda=True, warmup=5, repeats=50))
        cutlassfuse.set_cooperative_finalize(False)
        e = {name: statistics.median(v) for name, v in eager.items()}
        g = {name: statistics.median(v) for name, v in replay.items()}
        a, b = CHOICES
        print(f"{shape.name:15s} {e[a]:14.1f} {e[b]:13.1f} {e[a] / e[b]:6.3f} {g[a]:14.1f} {g[b]:13.1f} "
              f"{g[a] / g[b]:6.3f}")


if __name__ == "__main__":
    main()
