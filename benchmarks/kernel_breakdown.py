"""Per-kernel device time and launch count of one fused call (a layer's call: the weight
packed once, as the module caches it), next to cuDNN's convolution alone, from
torch.profiler (CUPTI) over repeated calls.

    python benchmarks/kernel_breakdown.py [--shape kb61] [--dtype float16] [--config 128x64_pingpong]
                                          [--float32-mode tf32]

--config pins the sm90 kernel configuration (cutlassfuse.backends dgrad_config; "auto",
the default, is the heuristic's choice). --float32-mode: the float32 mode of float32
runs ("tf32", the default, or "bf16x3"; "pytorch" runs the fallback).

--shape takes a benchmark shape name (kb61, kb61_v0, unet_k2s2, gan_k4s2p1,
vid_k3s2p1op1) or N,Cin,Cout,D,H,W,kernel,stride,padding,output_padding,groups.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.bench import parse_shape
from cutlassfuse.testing import op_arguments, packed_operands

REPEATS = 20
KERNEL_KEYS = ("PingpongPhasesKernel", "ConvUniversal", "ncdhw_to_ndhwc", "split_float32", "abs_max",
               "scale_tf32", "scale_filter", "fill_unreached",
               "group_norm_finalize", "group_norm_finish_bulk", "group_norm_finish_kernel<__half, true",
               "group_norm_finish_kernel<__half, false",
               "norm_activation_stats", "normalize_channels")


def kernel_times_us(fn) -> tuple[dict[str, float], float]:
    """Device time per call of each kernel name, and kernel launches per call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    launches = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[short(event.name)] += event.device_time / REPEATS
            launches += 1
    return dict(sorted(totals.items(), key=lambda kv: -kv[1])), launches / REPEATS


def short(name: str) -> str:
    return next((key for key in KERNEL_KEYS if key in name), name[:70])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="kb61")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    parser.add_argument("--config", default="auto", choices=["auto", *backends.dgrad_configs()],
                        help="pin the sm90 kernel configuration")
    parser.add_argument("--float32-mode", default="tf32", choices=["tf32", "bf16x3", "pytorch"])
    args = parser.parse_args()
    shape = parse_shape(args.shape)
    dtype = getattr(torch, args.dtype)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    k = shape.kernel
    w = torch.randn(shape.in_channels, shape.out_channels, k, k, k, device="cuda", dtype=dtype) * 0.05
    conv = dict(stride=shape.stride, padding=shape.padding, output_padding=shape.output_padding)
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    # A layer's calls: the weight packed once, as the module caches it.
    layer = dict(weight=w, num_groups=shape.groups, **conv)
    ncdhw, channels_last = (op_arguments(dict(layer, input=t, **packed_operands(layer))) for t in (x, x_cl))
    runs = {
        "cutlassfuse, NCDHW input": lambda: torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*ncdhw),
        "cutlassfuse, channels_last input": lambda: torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(
            *channels_last),
        "cuDNN conv_transpose3d alone, channels_last": lambda: F.conv_transpose3d(x_cl, w, **conv),
        "cutlassfuse fallback (fused path off), NCDHW input": lambda: cutlassfuse.conv_transpose3d_relu_group_norm(
            x, w, num_groups=shape.groups, **conv),
    }
    # float32 on the fused path is opt-in; the fallback run shows the default.
    float32_mode = args.float32_mode if dtype == torch.float32 else "pytorch"
    with cutlassfuse.float32_mode(float32_mode), backends.flags(dgrad_config=args.config):
        print(f"{shape.name} {args.dtype}: {cutlassfuse.explain(x, w, num_groups=shape.groups, **conv)}")
        for title, fn in runs.items():
            with backends.flags(fused_path="fallback" not in title):
                times, launches = kernel_times_us(fn)
            print(f"\n{title}: {sum(times.values()):.1f} us of kernels, {launches:g} launches per call")
            for name, us in times.items():
                print(f"  {us:9.1f} us  {name}")


if __name__ == "__main__":
    main()
