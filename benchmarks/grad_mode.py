"""Grad mode against torch.no_grad(): every benchmark layer (PyTorch's default conv bias,
as `cutlassfuse.bench` builds them) in float16, bfloat16 and float32 under each float32
mode ("pytorch", "tf32", "bf16x3"), then the three dtypes with the fused path turned off
(the CUDA fallback), each timed four ways in one process: PyTorch eager and cutlassfuse,
each under torch.no_grad() and in grad mode, the way most PyTorch code (and KernelBench's
harness) calls a model: the parameters require grad, no torch.no_grad(), the output
dropped without a backward.

    python benchmarks/grad_mode.py [--shapes kb61,gan_k4s2p1] [--dtypes float16,float32] [--csv grad.csv]
    python benchmarks/grad_mode.py --device cpu --tiny   # checks the script where there is no GPU

Per row: the path cutlassfuse takes (the prefix of `cutlassfuse.explain`), the four median
ms, each the median over `--rounds` rounds of one round's median of `--repeats` calls
between CUDA events, every call reading the next of fresh torch.rand input copies
(`bench.time_rotating`). Each round times every row once, its four models one after the
other: clock and host drift fall on all four of a row, and a slow stretch of the host
(its time per call swings by half for a second at a time on shared machines) on one
round of several rows rather than on every round of one; then cutlassfuse's
grad-mode time over its no_grad time (target: at most 1.10), eager's grad-mode time over
cutlassfuse's (target: above 1), and the largest difference between cutlassfuse's
grad-mode and no_grad outputs. Float32 eager runs under PyTorch's defaults (TF32 allowed
in cuDNN's convolutions). Rows that miss a target are flagged. The last line gives eager's
largest grad-mode time over its no_grad time: its GPU work is the same in both modes, so
where that ratio passes 1 the host's time per call, or its drift during the run, shows.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.__main__ import DTYPES, comma_list, positive_int
from cutlassfuse.bench import DEFAULT_SHAPES, BenchShape, layer_models, parse_shape, rotating_inputs, time_rotating

WARMUP = 3
MAX_GRAD_OVERHEAD = 1.10  # cutlassfuse's grad-mode time over its no_grad time
FLOAT32_MODES = ("pytorch", "tf32", "bf16x3")


@dataclass(frozen=True)
class Case:
    label: str
    setting: Callable[[], contextlib.AbstractContextManager]


def cases(dtype: torch.dtype) -> list[Case]:
    """The fused-path cases of a dtype (float32: one per float32 mode), then its fallback."""
    name = str(dtype).removeprefix("torch.")
    if dtype == torch.float32:
        fused = [Case(f"{name} {mode}", lambda mode=mode: cutlassfuse.float32_mode(mode)) for mode in FLOAT32_MODES]
    else:
        fused = [Case(name, contextlib.nullcontext)]
    return fused + [Case(f"{name} fallback", lambda: backends.flags(fused_path=False))]


@dataclass
class Row:
    shape: str
    case: str
    path: str
    eager_no_grad_ms: float
    eager_grad_ms: float
    cutlassfuse_no_grad_ms: float
    cutlassfuse_grad_ms: float
    grad_over_no_grad: float  # cutlassfuse grad / cutlassfuse no_grad
    speedup_over_eager_grad: float  # eager grad / cutlassfuse grad
    max_abs_grad_vs_no_grad: float  # cutlassfuse's outputs
    misses: str


def path_taken(fused: nn.Module, x: torch.Tensor) -> str:
    conv, norm = fused.conv_transpose, fused.group_norm
    explanation = cutlassfuse.explain(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding,
                                      conv.groups, conv.dilation, num_groups=norm.num_groups,
                                      norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps)
    return explanation.split(":")[0]


def grad_vs_no_grad(fused: nn.Module, x: torch.Tensor) -> float:
    tracked = fused(x)
    with torch.no_grad():
        untracked = fused(x)
    return (tracked.detach().double() - untracked.double()).abs().max().item()


@dataclass
class Measured:
    """One row's layers, inputs and case, and the medians of each round."""
    shape: BenchShape
    case: Case
    eager: nn.Module
    fused: nn.Module
    inputs: list[torch.Tensor]
    path: str = ""
    difference: float = 0.0
    samples: dict[str, list[float]] = field(default_factory=dict)

    def models(self) -> dict[str, tuple[nn.Module, bool]]:
        """The four timed calls: each model, called in grad mode where the flag is set."""
        return {"eager no_grad": (self.eager, False), "eager grad": (self.eager, True),
                "cutlassfuse no_grad": (self.fused, False), "cutlassfuse grad": (self.fused, True)}

    def check(self) -> None:
        """The path cutlassfuse takes and its grad-mode output against its no_grad one."""
        with self.case.setting():
            self.path = path_taken(self.fused, self.inputs[0])
            self.difference = grad_vs_no_grad(self.fused, self.inputs[0])

    def time_round(self, repeats: int) -> None:
        with self.case.setting():
            for name, (model, grad_mode) in self.models().items():
                with torch.set_grad_enabled(grad_mode):
                    self.samples.setdefault(name, []).append(time_rotating(model, self.inputs, WARMUP,
                                                                           repeats).median_ms)

    def row(self) -> Row:
        ms = {name: statistics.median(values) for name, values in self.samples.items()}
        overhead = ms["cutlassfuse grad"] / ms["cutlassfuse no_grad"]
        speedup = ms["eager grad"] / ms["cutlassfuse grad"]
        misses = []
        if overhead > MAX_GRAD_OVERHEAD:
            misses.append(f"grad/no_grad > {MAX_GRAD_OVERHEAD:.2f}")
        if speedup <= 1.0:
            misses.append("not faster than eager grad")
        return Row(self.shape.name, self.case.label, self.path, ms["eager no_grad"], ms["eager grad"],
                   ms["cutlassfuse no_grad"], ms["cutlassfuse grad"], overhead, speedup, self.difference,
                   "; ".join(misses))


def print_row(r: Row) -> None:
    flag = f"  <- MISS: {r.misses}" if r.misses else ""
    print(f"{r.shape:<20}{r.case:<19}{r.path:<12}{r.eager_no_grad_ms:>10.3f}{r.eager_grad_ms:>10.3f}"
          f"{r.cutlassfuse_no_grad_ms:>10.3f}{r.cutlassfuse_grad_ms:>10.3f}{r.grad_over_no_grad:>8.3f}"
          f"{r.speedup_over_eager_grad:>9.2f}{r.max_abs_grad_vs_no_grad:>10.1e}{flag}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(s.name for s in DEFAULT_SHAPES),
                        help="comma-separated names of cutlassfuse.bench.DEFAULT_SHAPES")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32", type=comma_list(DTYPES))
    parser.add_argument("--repeats", type=positive_int, default=30, help="timed calls per model and round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="rounds, each timing every row once")
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="each shape at one sample and a fraction of its size")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("grad_mode.py: no CUDA device (`--device cpu --tiny` checks the script on the CPU)")
    shapes = [parse_shape(name) for name in args.shapes.split(",")]
    shapes = [shape.tiny() for shape in shapes] if args.tiny else shapes
    dtypes = [getattr(torch, name) for name in args.dtypes]
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}; median ms; g/ng: cutlassfuse grad / no_grad (target <= "
          f"{MAX_GRAD_OVERHEAD:.2f}); vs eager: eager grad / cutlassfuse grad (target > 1); |g-ng|: max abs "
          "difference of cutlassfuse's grad-mode and no_grad outputs")
    print(f"{'shape':<20}{'case':<19}{'path':<12}{'eager ng':>10}{'eager g':>10}{'cf ng':>10}{'cf g':>10}{'g/ng':>8}"
          f"{'vs eager':>9}{'|g-ng|':>10}")
    start = time.perf_counter()
    measured = []
    for shape in shapes:
        for dtype in dtypes:
            eager, fused = layer_models(shape, dtype, device)
            inputs = rotating_inputs(shape, dtype, device)
            measured += [Measured(shape, case, eager, fused, inputs) for case in cases(dtype)]
    for m in measured:
        m.check()
    for _ in range(args.rounds):
        for m in measured:
            m.time_round(args.repeats)
    rows = [m.row() for m in measured]
    for r in rows:
        print_row(r)
    missed = sum(bool(r.misses) for r in rows)
    eager_noise = max(r.eager_grad_ms / r.eager_no_grad_ms for r in rows)
    print(f"{missed} of {len(rows)} rows miss a target; {time.perf_counter() - start:.0f} s")
    print(f"eager's own grad mode / no_grad: up to {eager_noise:.2f}x in this run")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)


if __name__ == "__main__":
    main()
