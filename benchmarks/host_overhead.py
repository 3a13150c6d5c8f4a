"""Host cost of one fused call next to its device time, for every benchmark shape,
under torch.no_grad() and in grad mode (parameters requiring grad, no backward): when
the CPU needs longer to issue a call than the GPU needs to run it, the GPU idles
between calls and the wall time per call is the host's.

    python benchmarks/host_overhead.py [--dtype float16] [--table kb61_v0] [--grad-mode]

Per shape and mode: wall time per call (CUDA events over back-to-back calls) and host
time per call (perf_counter over calls issued into an idle queue, no synchronization
inside); then the host time of the pieces of one kb61_v0 call in both modes; with
--table the profiler's CPU-side events of that shape (in grad mode with --grad-mode),
by self CPU time.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from torch.profiler import ProfilerActivity, profile

from cutlassfuse.bench import DEFAULT_SHAPES, BenchShape, parse_shape
from cutlassfuse.modules import ConvTranspose3dReLUGroupNorm

CALLS = 20  # 4-5 launches each: far below the launch queue's depth, so issuing never waits on the GPU


def layer_and_input(shape: BenchShape, dtype: torch.dtype):
    layer = ConvTranspose3dReLUGroupNorm(shape.in_channels, shape.out_channels, shape.kernel, shape.groups,
                                         bias=True, stride=shape.stride, padding=shape.padding,
                                         output_padding=shape.output_padding, device="cuda", dtype=dtype)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    return layer, x


def host_us_per_call(fn) -> float:
    samples = []
    for _ in range(10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        samples.append((time.perf_counter() - start) / CALLS * 1e6)
        torch.cuda.synchronize()
    return sorted(samples)[len(samples) // 2]


def device_us_per_call(fn) -> float:
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(10):
        torch.cuda.synchronize()
        begin.record()
        for _ in range(CALLS):
            fn()
        end.record()
        end.synchronize()
        samples.append(begin.elapsed_time(end) / CALLS * 1e3)
    return sorted(samples)[len(samples) // 2]


# The two ways a model is called: (name, context manager factory).
MODES = (("no_grad", torch.no_grad), ("grad mode", contextlib.nullcontext))


def print_components(shape: BenchShape, dtype: torch.dtype) -> None:
    """Host time of the pieces of one call, each issued alone, to see what the whole costs."""
    from cutlassfuse.ops import _op_arguments  # the op's positional arguments

    layer, x = layer_and_input(shape, dtype)
    conv, norm = layer.conv_transpose, layer.group_norm
    op_args = _op_arguments(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding, conv.groups,
                            conv.dilation, norm.num_groups, norm.weight, norm.bias, norm.eps,
                            *layer._conv_operands()[2:])
    small = torch.empty(16, device="cuda")
    ops = torch.ops.cutlassfuse
    pieces = {
        "module call": lambda: layer(x),
        "op, arguments prepared": lambda: ops.conv_transpose3d_relu_group_norm(*op_args),
        "op keeping for the backward, no autograd node": lambda: ops.conv_transpose3d_relu_group_norm_for_backward(
            *op_args, False, False),
        "explain op (validate, route, describe)": lambda: ops.explain(*op_args),
        "plain CUTLASS op (transpose + conv)": lambda: ops.conv_transpose3d_cutlass(*op_args),
        "4 x torch.empty": lambda: [torch.empty(1024, device="cuda") for _ in range(4)],
        "4 x small kernel (add_)": lambda: [small.add_(1.0) for _ in range(4)],
    }
    print(f"\n{shape.name}: host us per call of each piece alone")
    print(f"  {'':48s} {'no_grad':>9s} {'grad mode':>9s}")
    for name, fn in pieces.items():
        times = []
        for _, mode in MODES:
            with mode():
                fn()
                times.append(host_us_per_call(fn))
        print(f"  {name:48s} {times[0]:9.1f} {times[1]:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--table", default=None, help="a shape whose CPU-side profile to print")
    parser.add_argument("--grad-mode", action="store_true", help="profile the --table shape in grad mode")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    header = "".join(f" {name + ' wall':>15s} {name + ' host':>15s}" for name, _ in MODES)
    print(f"{'shape':16s}{header}  (us per call)")
    for shape in DEFAULT_SHAPES:
        layer, x = layer_and_input(shape, dtype)
        fn = lambda: layer(x)  # noqa: E731
        row = ""
        for _, mode in MODES:
            with mode():
                for _ in range(5):
                    fn()
                row += f" {device_us_per_call(fn):15.1f} {host_us_per_call(fn):15.1f}"
        print(f"{shape.name:16s}{row}")
    print_components(parse_shape("kb61_v0"), dtype)
    if args.table:
        layer, x = layer_and_input(parse_shape(args.table), dtype)
        with contextlib.nullcontext() if args.grad_mode else torch.no_grad():
            for _ in range(5):
                layer(x)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(CALLS):
                    layer(x)
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
