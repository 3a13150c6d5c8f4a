"""Sub-pixel phases on one stream or spread over side streams (cutlassfuse.backends phase_streams),
median ms of one fused call per strided benchmark shape, in one run.

    python benchmarks/phase_streams.py [--dtype float16]
"""

from __future__ import annotations

import argparse

import torch

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.bench import parse_shape
from cutlassfuse.benchmarking import median_ms

SHAPES = ["gan_k4s2p1", "vid_k3s2p1op1", "unet_k2s2"]
LANES = [1, 2, 4, 8]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    dtype = getattr(torch, parser.parse_args().dtype)
    print(f"{'shape':<16}" + "".join(f"{f'{n} stream(s)':>14}" for n in LANES) + "   path")
    for name in SHAPES:
        shape = parse_shape(name)
        torch.manual_seed(0)
        module = cutlassfuse.ConvTranspose3dReLUGroupNorm(
            shape.in_channels, shape.out_channels, shape.kernel, shape.groups, stride=shape.stride,
            padding=shape.padding, output_padding=shape.output_padding, bias=True).cuda().to(dtype)
        x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
        times = []
        with torch.no_grad():
            for lanes in LANES:
                with backends.flags(phase_streams=lanes):
                    times.append(median_ms(lambda: module(x), cuda=True, warmup=10, repeats=50))
        conv = module.conv_transpose
        path = cutlassfuse.explain(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding,
                                   num_groups=shape.groups)
        print(f"{name:<16}" + "".join(f"{t:14.3f}" for t in times) + f"   {path[:60]}")


if __name__ == "__main__":
    main()
