"""Per-call time spread of the fused module, eager calls against CUDA graph replay.

    python benchmarks/call_spread.py [--shape vid_k3s2p1op1] [--dtype float16] [--calls 200]

Eager calls issued back to back run at the GPU's pace only while the host issues each
call faster than the GPU runs it; CUDA graph replay takes the host out. When the eager
percentiles sit above the graph's, the difference is host time (or host jitter), not
kernel time.
"""

from __future__ import annotations

import argparse

import torch

from cutlassfuse.bench import parse_shape
from cutlassfuse.modules import ConvTranspose3dReLUGroupNorm


def percentiles_us(run, calls: int) -> str:
    for _ in range(20):
        run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) * 1e3 for start, end in events)
    return "  ".join(f"p{p} {times[min(len(times) - 1, len(times) * p // 100)]:7.1f}" for p in (5, 20, 50, 80, 95))


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="vid_k3s2p1op1")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    shape, dtype = parse_shape(args.shape), getattr(torch, args.dtype)
    layer = ConvTranspose3dReLUGroupNorm(shape.in_channels, shape.out_channels, shape.kernel, shape.groups,
                                         bias=True, stride=shape.stride, padding=shape.padding,
                                         output_padding=shape.output_padding, device="cuda", dtype=dtype)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    print(f"{shape.name} {args.dtype}, us per call")
    print(f"  eager calls   {percentiles_us(lambda: layer(x), args.calls)}")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            layer(x)  # warm the module's packed parameters and the allocator outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer(x)
    print(f"  graph replay  {percentiles_us(graph.replay, args.calls)}")


if __name__ == "__main__":
    main()
