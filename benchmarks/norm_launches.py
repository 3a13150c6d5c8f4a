"""GroupNorm + ReLU in one launch (the resident kernel, its tensor held in shared memory
and, where larger, streamed through L2) against the three launches (statistics, finalize,
normalize: `backends.flags(resident_norm=False)`), in one process, interleaved round by
round: the standalone norm (beside one copy of the tensor and eager's modules), then
blocks on the fallback (cuDNN's convolution, then the norm: Conv3d k3 p1 + GroupNorm + ReLU,
`backends.flags(fused_path=False)`, beside eager's modules).

    python benchmarks/norm_launches.py [--rounds 7] [--repeats 20]

Per case, dtype and layout: the path `explain` names, median µs per call (CUDA events over
`--repeats` back-to-back calls, median of `--rounds`), for the standalone norm the resident
kernel's own time (torch.profiler) and the one launch over one copy, and the max abs errors
against float64. The two calls of cutlassfuse must be bitwise equal.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse import backends

# (name, shape, groups): held whole by shared memory; a third streamed; SegResNet's 67 MB norm
CASES = [("segres_64", (1, 32, 64, 64, 64), 8), ("stream_112", (1, 16, 112, 112, 112), 8),
         ("segres_norm", (1, 16, 128, 128, 128), 8)]
# (name, batch, input channels, output channels, pixels, groups, dtype, channels_last)
FALLBACK_BLOCKS = [("1x32x64^3", 1, 32, 32, (64, 64, 64), 8, torch.float16, True),
                   ("2x16x96^3", 2, 8, 16, (96, 96, 96), 4, torch.float16, True),
                   ("1x16x128^3", 1, 16, 16, (128, 128, 128), 8, torch.float16, True),
                   ("1x32x64^3", 1, 32, 32, (64, 64, 64), 8, torch.float32, True),
                   ("1x32x64^3", 1, 32, 32, (64, 64, 64), 8, torch.float32, False)]
KERNEL = "norm_activation_resident_kernel"


def per_call_us(fn, repeats: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def kernel_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    times = [e.device_time for e in p.events() if KERNEL in e.name and e.device_time > 0]
    return statistics.median(times) if times else float("nan")


def measure(shape, groups: int, dtype: torch.dtype, channels_last: bool, args) -> str:
    generator = torch.Generator("cuda").manual_seed(hash((shape, channels_last)) % 1000)
    x = torch.randn(shape, device="cuda", generator=generator).mul_(2).add_(0.5).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    path = cutlassfuse.explain_block(cutlassfuse.group_norm_activation, x, groups, activation="relu")
    path = "one" if "one cutlassfuse" in path else "three"
    copy_target = torch.empty_like(x)

    def one():
        return cutlassfuse.group_norm_activation(x, groups, activation="relu")

    def three():
        with backends.flags(resident_norm=False):
            return one()

    implementations = {"one": one, "three": three, "copy": lambda: copy_target.copy_(x),
                       "eager": lambda: F.relu(F.group_norm(x, groups))}
    with torch.no_grad():
        expected = F.relu(F.group_norm(x.double(), groups))
        out = one()
        assert torch.equal(out, one()), "two calls differ"
        ours = (out.double() - expected).abs().max().item()
        eager = (implementations["eager"]().double() - expected).abs().max().item()
        m = interleaved(implementations, args)
        kernel = kernel_us(one)
    return (f"{path:6} {m['one']:8.1f} {m['three']:8.1f} {m['copy']:7.1f} {m['eager']:8.1f} {kernel:7.1f} "
            f"{m['one'] / m['copy']:6.2f} {ours:.1e} / {eager:.1e}")


def interleaved(implementations: dict, args) -> dict:
    times = {name: [] for name in implementations}
    for _ in range(args.rounds):
        for name, fn in implementations.items():
            times[name].append(per_call_us(fn, args.repeats))
    return {name: statistics.median(t) for name, t in times.items()}


def measure_block(batch, cin, cout, pixels, groups, dtype, channels_last, args) -> str:
    torch.manual_seed(0)
    conv, norm = nn.Conv3d(cin, cout, 3, padding=1).cuda(), nn.GroupNorm(groups, cout).cuda()
    x = torch.randn(batch, cin, *pixels, device="cuda")
    with torch.no_grad():
        expected = F.relu(norm.double()(conv.double()(x.double())))
    conv, norm = conv.to(dtype), norm.to(dtype)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = x.to(dtype).contiguous(memory_format=memory_format)
    weight = conv.weight.contiguous(memory_format=memory_format)
    arguments = dict(padding=1, num_groups=groups, norm_weight=norm.weight, norm_bias=norm.bias, activation="relu")

    def one():
        return cutlassfuse.conv3d_norm_activation(x, weight, conv.bias, **arguments)

    def three():
        with backends.flags(resident_norm=False):
            return one()

    implementations = {"one": one, "three": three, "eager": lambda: F.relu(norm(conv(x)))}
    with torch.no_grad(), backends.flags(fused_path=False):
        path = cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, weight, conv.bias, **arguments)
        path = "one" if "one cutlassfuse" in path else "three"
        assert torch.equal(one(), one()), "two calls differ"
        error = {name: (fn().double() - expected).abs().max().item() for name, fn in implementations.items()}
        m = interleaved(implementations, args)
    return (f"{path:6} {m['one']:8.1f} {m['three']:8.1f} {m['eager']:8.1f} "
            f"{error['one']:.1e} / {error['three']:.1e} / {error['eager']:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'case':12} {'dtype':9} {'layout':6} {'path':6} {'one':>8} {'three':>8} {'copy':>7} {'eager':>8} "
          f"{'kernel':>7} {'/copy':>6} err cutlassfuse / eager")
    for name, shape, groups in CASES:
        for dtype in (torch.float16, torch.bfloat16):
            for channels_last in (True, False):
                row = measure(shape, groups, dtype, channels_last, args)
                print(f"{name:12} {str(dtype)[6:]:9} {'cl' if channels_last else 'ncdhw':6} {row}", flush=True)
    print(f"\nfallback blocks: {'case':12} {'dtype':9} {'layout':6} {'path':6} {'one':>8} {'three':>8} {'eager':>8} "
          "err one / three / eager")
    for name, batch, cin, cout, pixels, groups, dtype, channels_last in FALLBACK_BLOCKS:
        row = measure_block(batch, cin, cout, pixels, groups, dtype, channels_last, args)
        print(f"{'':17}{name:12} {str(dtype)[6:]:9} {'cl' if channels_last else 'ncdhw':6} {row}", flush=True)


if __name__ == "__main__":
    main()
