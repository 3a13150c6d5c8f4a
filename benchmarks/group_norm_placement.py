"""Where the GroupNorm runs, timed per call on every baselines.md shape (module calls,
NCDHW input): streamed by the deconvolution kernel's producer warps while it computes
(set_streamed_normalize(True), the default), finalized by the conv kernel after its last
tile with a normalize kernel after it (set_cooperative_finalize(True)), or in a finalize
and a normalize kernel of their own; and the same CUTLASS convolution with a plain store,
the floor the fused op is measured against (issue 3: fused <= 1.15x plain).

    python benchmarks/group_norm_placement.py [--dtype float16] [--rounds 5]

Eager calls (host included) and CUDA graph replay (GPU time alone), medians of CUDA
events around each call; the choices alternate round by round in one process, so clock
and thermal drift fall on all of them.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import cutlassfuse
from cutlassfuse.bench import DEFAULT_SHAPES
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.modules import ConvTranspose3dReLUGroupNorm

CHOICES = {  # (streamed normalize, cooperative finalize); None: the plain CUTLASS conv
    "streamed": (True, False),
    "finalize in conv": (False, True),
    "separate kernels": (False, False),
    "plain conv": None,
}


def set_choice(choice) -> None:
    streamed, cooperative = choice or (True, False)
    cutlassfuse.set_streamed_normalize(streamed)
    cutlassfuse.set_cooperative_finalize(cooperative)


def plain_conv(layer):
    conv = layer.conv_transpose
    weight, bias = conv.weight, conv.bias

    def run(x):  # every sub-pixel phase, plain stores, no bias, ReLU or statistics
        return torch.ops.cutlassfuse.conv_transpose3d_cutlass(
            x, weight, bias, None, None, 1, 1e-5, list(conv.stride), list(conv.padding), list(conv.output_padding), 1,
            [1] * 3, None)
    return run


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
    print(f"GPU: {torch.cuda.get_device_name()}, {args.dtype}, us per call (median of {args.rounds} rounds), "
          "eager / graph replay")
    names = list(CHOICES)
    print(f"{'shape':15s} " + " ".join(f"{name:>22s}" for name in names) + f" {'streamed / plain':>17s}")
    for shape in DEFAULT_SHAPES:
        layer = ConvTranspose3dReLUGroupNorm(shape.in_channels, shape.out_channels, shape.kernel, shape.groups,
                                             bias=True, stride=shape.stride, padding=shape.padding,
                                             output_padding=shape.output_padding, device="cuda", dtype=dtype)
        x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
        calls = {name: (plain_conv(layer) if choice is None else layer) for name, choice in CHOICES.items()}
        eager = {name: [] for name in CHOICES}
        replay = {name: [] for name in CHOICES}
        for _ in range(args.rounds):
            for name, choice in CHOICES.items():
                set_choice(choice)
                call = calls[name]
                eager[name].append(1e3 * median_ms(lambda: call(x), cuda=True, warmup=10, repeats=50))
                graph = graph_of(lambda: call(x))
                replay[name].append(1e3 * median_ms(graph.replay, cuda=True, warmup=5, repeats=50))
        set_choice(None)
        e = {name: statistics.median(v) for name, v in eager.items()}
        g = {name: statistics.median(v) for name, v in replay.items()}
        cells = " ".join(f"{e[name]:10.1f} / {g[name]:9.1f}" for name in names)
        ratio = f"{e['streamed'] / e['plain conv']:.3f} / {g['streamed'] / g['plain conv']:.3f}"
        print(f"{shape.name:15s} {cells} {ratio:>17s}")


if __name__ == "__main__":
    main()
