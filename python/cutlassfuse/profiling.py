"""`python -m cutlassfuse profile`: Nsight Compute on one call of the op, a short table
per kernel. ncu runs with --clock-control none (the card's clocks as found) and
profiles every kernel of the one call bracketed by cudaProfilerStart/Stop, after
warm-up calls (the module's packed weight is cached by then, so those are the op's
kernels only).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys

import torch

from .bench import parse_shape

METRICS = {
    "Duration": "duration",
    "Compute (SM) Throughput": "SM %",
    "Memory Throughput": "memory %",
    "DRAM Throughput": "DRAM %",
    "Achieved Occupancy": "occupancy %",
}
KERNEL_KEYS = ("PingpongPhasesKernel", "ConvUniversal", "group_norm_finish", "group_norm_finalize", "ncdhw_to_ndhwc",
               "fill_unreached", "split_float32", "norm_activation_stats", "normalize_channels")
# Tensor-pipe utilization has per-architecture names (wgmma on Hopper, mma.sync
# before), and a metric ncu knows can still read n/a on a given GPU (the gmma-cycles
# one did on the H200's ncu). One unknown metric fails the whole ncu run, so the
# profile asks `ncu --query-metrics` which bases it knows, requests every candidate
# among them, and the table shows the largest number among them (on the H100's ncu the
# gmma-cycles metric read 0 % for the wgmma conv kernel, so the first number is not
# enough).
TENSOR_PIPE_METRICS = (
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "sm__ops_path_tensor_src_fp16_dst_fp32.avg.pct_of_peak_sustained_elapsed",
    "sm__ops_path_tensor_src_bf16_dst_fp32.avg.pct_of_peak_sustained_elapsed",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
)
TENSOR_PIPE_LABEL = "tensor pipe %"


def ncu_executable() -> str:
    return os.environ.get("NCU") or shutil.which("ncu") or "/usr/local/cuda/bin/ncu"


def tensor_pipe_metrics(known_metrics: str) -> tuple[str, ...]:
    """The candidates whose base metric appears in `ncu --query-metrics`'s output."""
    return tuple(m for m in TENSOR_PIPE_METRICS if re.search(rf"\b{m.split('.')[0]}\b", known_metrics))


def ncu_command(shape: str, dtype: str, memory_format: str, metrics: tuple[str, ...] = ()) -> list[str]:
    return [ncu_executable(), "--clock-control", "none", "--profile-from-start", "off",
            "--section", "SpeedOfLight", "--section", "Occupancy", "--section", "ComputeWorkloadAnalysis",
            *(["--metrics", ",".join(metrics)] if metrics else []), "--csv", "--page", "details",
            sys.executable, "-m", "cutlassfuse.profiling", shape, dtype, memory_format]


def short_name(kernel: str) -> str:
    return next((k for k in KERNEL_KEYS if k in kernel), kernel[:40])


def summarize(csv_text: str) -> str:
    lines = [line for line in csv_text.splitlines() if line.startswith('"')]
    table: dict[tuple[str, str], dict[str, str]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        key = (row["ID"], short_name(row["Kernel Name"]))
        name = row["Metric Name"]
        label = METRICS.get(name) or (TENSOR_PIPE_LABEL if name in TENSOR_PIPE_METRICS else None)
        values = table.setdefault(key, {})
        if label == TENSOR_PIPE_LABEL:
            if not _is_number(row["Metric Value"]):
                continue  # this candidate reads n/a
            if label in values and _number(values[label].split()[0]) >= _number(row["Metric Value"]):
                continue  # another candidate gave more
        if label:
            values[label] = f'{row["Metric Value"]} {row["Metric Unit"]}'.strip()
    columns = list(dict.fromkeys(c for values in table.values() for c in values))
    out = ["| kernel | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    out += [f"| {kernel} | " + " | ".join(values.get(c, "-") for c in columns) + " |"
            for (_, kernel), values in table.items()]
    return "\n".join(out)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _is_number(text: str) -> bool:
    try:
        _number(text)
        return True
    except ValueError:
        return False


def run_profile(shape: str, dtype: str, memory_format: str, csv_path: str | None = None) -> str:
    if shutil.which(ncu_executable()) is None:
        raise SystemExit(f"cutlassfuse profile: Nsight Compute's ncu not found at {ncu_executable()} "
                         "(put it on PATH or set NCU)")
    known = subprocess.run([ncu_executable(), "--query-metrics"], capture_output=True, text=True).stdout
    metrics = tensor_pipe_metrics(known)
    if not metrics:
        print("ncu knows none of the tensor-pipe metrics: no tensor pipe column", file=sys.stderr)
    command = ncu_command(shape, dtype, memory_format, metrics)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"ncu failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    if csv_path:
        with open(csv_path, "w") as f:
            f.write(result.stdout)
    return summarize(result.stdout)


def _profiled_call(shape_text: str, dtype_name: str, memory_format: str) -> None:
    """Runs inside ncu: warm-up calls, then one call between profiler start and stop."""
    import cutlassfuse

    shape = parse_shape(shape_text)
    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(
        shape.in_channels, shape.out_channels, shape.kernel, shape.groups, stride=shape.stride,
        padding=shape.padding, output_padding=shape.output_padding).cuda().to(dtype)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    if memory_format == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last_3d)
    with torch.no_grad():
        for _ in range(2):
            module(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        module(x)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    _profiled_call(*sys.argv[1:4])
