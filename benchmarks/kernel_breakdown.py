"""Per-kernel device time of one fused call on KernelBench level2/61, next to cuDNN's
convolution alone, from torch.profiler (CUPTI) over repeated calls.

    python benchmarks/kernel_breakdown.py [--dtype float16]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import cutlassfuse

REPEATS = 20


def kernel_times_us(fn) -> dict[str, float]:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPEATS):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.device_time / REPEATS
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def short(name: str) -> str:
    for key in ("ConvUniversal", "ncdhw_to_ndhwc", "group_norm_finalize", "group_norm_apply_kernel<__half, true",
                "group_norm_apply_kernel<__half, false"):
        if key in name:
            return key
    return name[:70]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    dtype = getattr(torch, parser.parse_args().dtype)
    x = torch.rand(16, 64, 32, 32, 32, device="cuda", dtype=dtype)
    w = torch.randn(64, 128, 3, 3, 3, device="cuda", dtype=dtype) * 0.05
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    runs = {
        "cutlassfuse, NCDHW input": lambda: cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=8),
        "cutlassfuse, channels_last input": lambda: cutlassfuse.conv_transpose3d_relu_group_norm(x_cl, w,
                                                                                                 num_groups=8),
        "cuDNN conv_transpose3d alone, channels_last": lambda: F.conv_transpose3d(x_cl, w),
    }
    for title, fn in runs.items():
        times = kernel_times_us(fn)
        print(f"\n{title}: {sum(times.values()):.1f} us of kernels per call")
        for name, us in times.items():
            print(f"  {us:9.1f} us  {short(name)}")


if __name__ == "__main__":
    main()
