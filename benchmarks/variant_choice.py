"""Two variants of the sm90 kernel, per shape: the fused call and the same kernel with
a plain store, channels_last input (no layout conversion), timed in alternating rounds
so that clock and host drift fall on both variants alike.

    python benchmarks/variant_choice.py clusters [--rounds 7] [--shape kb61 --shape 4,128,256,24,24,24,3,1,0,0,16]
    python benchmarks/variant_choice.py border-taps [--shape kb61_v0]
    python benchmarks/variant_choice.py tile-schedule [--graph]

clusters: the 128x128 ping-pong kernel in clusters of one or two CTAs (the data behind
choose_config's cluster rule). border-taps: the heuristic's configuration running every
K block of every tile, or skipping the depth taps that reach none of a tile's pixels
(tap_window.h). tile-schedule: the heuristic's configuration with each CTA walking a
static list of tiles, or drawing them as it reaches them (unit_schedule.cuh; clusters of
two always walk statically).

Per shape and variant: the median over rounds of each round's median of CUDA-event
times; the ratio second / first with the spread of the per-round ratios. --graph times
replays of a CUDA graph of 10 calls per variant (captured with the variant's switch
set), per call: the kernels' time without the host's, which bounds calls below ~0.1 ms.
Variants are cutlassfuse.backends flags.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from cutlassfuse import backends
from cutlassfuse.bench import DEFAULT_SHAPES, parse_shape
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.testing import op_arguments, packed_operands

# Per comparison: each variant's name and the flags it runs under.
VARIANTS = {
    "clusters": [("1x1", dict(dgrad_config="128x128_pingpong")),
                 ("2x1", dict(dgrad_config="128x128_pingpong_cluster2x1"))],
    "border-taps": [("every tap", dict(skip_border_taps=False)), ("skipped", dict(skip_border_taps=True))],
    "tile-schedule": [("static", dict(drawn_tile_schedule=False)), ("drawn", dict(drawn_tile_schedule=True))],
}


def calls(shape, dtype: torch.dtype) -> dict[str, object]:
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last_3d)
    k = shape.kernel
    w = torch.randn(shape.in_channels, shape.out_channels, k, k, k, device="cuda", dtype=dtype) * 0.05
    layer = dict(input=x, weight=w, num_groups=shape.groups, stride=shape.stride, padding=shape.padding,
                 output_padding=shape.output_padding)
    fused = op_arguments(dict(layer, **packed_operands(layer)))  # the weight packed once, as the module caches it
    triple = [shape.stride] * 3, [shape.padding] * 3, [shape.output_padding] * 3
    return {
        "fused": lambda: torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*fused),
        "plain store": lambda: torch.ops.cutlassfuse.conv_transpose3d_cutlass(
            x, w, None, None, None, shape.groups, 1e-5, *triple, 1, [1] * 3, None),
    }


GRAPH_CALLS = 10


def graphed(fn, flags: dict):
    """GRAPH_CALLS calls of fn in one CUDA graph, captured under `flags`."""
    with backends.flags(**flags):
        fn()  # warm-up outside the capture (launch parameters, allocator)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(GRAPH_CALLS):
                fn()
    return graph.replay


def compare(shape, dtype: torch.dtype, rounds: int, comparison: str, graph: bool) -> None:
    variants = VARIANTS[comparison]
    (first, _), (second, _) = variants
    for name, fn in calls(shape, dtype).items():
        times = {variant: [] for variant, _ in variants}
        try:
            runs = {variant: (graphed(fn, flags) if graph else fn, flags) for variant, flags in variants}
            per_call = GRAPH_CALLS if graph else 1
            for _ in range(rounds):
                for variant, (run, flags) in runs.items():
                    with backends.flags(**flags):
                        times[variant].append(median_ms(run, cuda=True, warmup=5, repeats=30) / per_call)
        except RuntimeError as error:  # the plain CUTLASS conv refusing a problem
            print(f"{shape.name:28s} {name}: skipped ({str(error).splitlines()[0]})")
            continue
        ratios = sorted(b / a for a, b in zip(*times.values(), strict=True))
        a, b = (statistics.median(times[v]) for v in (first, second))
        print(f"{shape.name:28s} {str(dtype).removeprefix('torch.'):9s} {name:12s} {first} {a:8.4f} ms  "
              f"{second} {b:8.4f} ms  {second}/{first} {statistics.median(ratios):.3f} "
              f"({ratios[0]:.3f}-{ratios[-1]:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("comparison", choices=sorted(VARIANTS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shape", action="append", help="a benchmark shape name or N,Cin,Cout,D,H,W,k,s,p,op,groups")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--graph", action="store_true", help="time CUDA graph replays (no host time per call)")
    args = parser.parse_args()
    shapes = [parse_shape(s) for s in args.shape] if args.shape else list(DEFAULT_SHAPES)
    with torch.no_grad():
        for shape in shapes:
            compare(shape, getattr(torch, args.dtype), args.rounds, args.comparison, args.graph)


if __name__ == "__main__":
    main()
