"""KernelBench level2/61 judged the way KernelBench's own evaluation judges a ModelNew
(`eval_kernel_against_ref` in its src/eval.py, with its "cuda_event" timing), without
KernelBench installed: the problem's `Model` and `ModelNew` from examples/kernelbench_61.py.

    python benchmarks/kernelbench_harness.py [--precisions fp32,fp16,bf16] [--float32-mode pytorch]
    python benchmarks/kernelbench_harness.py --device cpu --tiny --trials 2   # checks the script without a GPU

KernelBench's method, step by step:

- The problem: `get_init_inputs()` gives [64, 128, 3, 8, False] (in and out channels,
  kernel size, GroupNorm groups, no conv bias), `get_inputs()` one float32
  `torch.rand(16, 64, 32, 32, 32)` on the CPU.
- The models: each built under torch.no_grad() right after seeding 42 (torch.manual_seed
  and torch.cuda.manual_seed), on the CPU, then moved with `.to(device, precision)`. Their
  parameters still require grad: no_grad does not change that.
- Correctness: 5 trials, as KernelBench's scripts run it (num_correct_trials=5). Their
  seeds are drawn after torch.manual_seed(42), one `torch.randint(0, 2**32 - 1, (1,))`
  per trial; a trial seeds with its seed, calls `get_inputs()`, casts the input to the
  precision and moves it to the GPU, runs `Model` then `ModelNew` under torch.no_grad(), and
  passes when the shapes agree and `torch.allclose(output, output_new, atol=tol,
  rtol=tol)`. The tolerance depends on the precision (its get_tolerance_for_precision):
  1e-4 for fp32, 1e-2 for fp16 and bf16; KernelBench v0 and v0.1 ran fp32 only and judged
  it at 1e-2. Both counts are printed.
- Timing: after seeding 42, one `get_inputs()` input; `ModelNew` is timed, then `Model`
  the same way (eval_kernel_against_ref times the reference beside the new model to flag
  excessive speedups): 3 warm-up calls, each followed by a synchronize;
  torch.cuda.empty_cache(); then 101 trials (num_perf_trials=100 in its scripts, plus one
  dropped first): synchronize, fill a 256 MiB tensor to flush the L2, a CUDA event, the
  call, a CUDA event, synchronize. The runtime is the mean of the 100 trials, rounded to 3
  significant digits; the speedup is the reference's runtime over ModelNew's. The timed
  calls are not wrapped in torch.no_grad(): with its parameters requiring grad, each
  forward is recorded by autograd (its output then dropped, no backward).
- Beside that, the "no_grad" columns time both models under torch.no_grad() in the same
  way with 5 warm-ups, as KernelBench's reference-time script (measure_ref_program_time,
  used for its baseline tables) times the reference.

Float32 runs under PyTorch's defaults (TF32 allowed in cuDNN's convolutions) and
cutlassfuse's float32 mode `--float32-mode` (default "pytorch", the library's default).
On the CPU (`--device cpu`) the calls are timed on the host clock and nothing is flushed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import cutlassfuse
from cutlassfuse.__main__ import comma_list, positive_int
from cutlassfuse.bench import BenchShape, parse_shape
from cutlassfuse.demo import describe

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kernelbench_61.py"
PRECISIONS = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}  # KernelBench's get_tolerance_for_precision
FIRST_TOLERANCE = 1e-2  # KernelBench v0 and v0.1, every output
SEED = 42
CORRECTNESS_TRIALS = 5
WARMUP = 3  # its timing function's default
REFERENCE_TIME_WARMUP = 5  # its reference-time script's
DISCARDED_TRIALS = 1
L2_FLUSH_ELEMENTS = 32 * 1024 * 1024  # int64: 256 MiB


def get_init_inputs(shape: BenchShape) -> list:
    return [shape.in_channels, shape.out_channels, shape.kernel, shape.groups, False]


def get_inputs(shape: BenchShape) -> list[torch.Tensor]:
    return [torch.rand(shape.batch, shape.in_channels, *shape.size)]


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    torch.cuda.manual_seed(seed)


def on_device(inputs: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    return [x.to(dtype=dtype).to(device=device) for x in inputs]


def build(model_class: type[nn.Module], shape: BenchShape, dtype: torch.dtype, device: torch.device) -> nn.Module:
    seed_everything(SEED)
    init_inputs = get_init_inputs(shape)
    with torch.no_grad():
        seed_everything(SEED)
        model = model_class(*init_inputs)
    return model.to(device=device, dtype=dtype)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def correct_trials(model: nn.Module, model_new: nn.Module, shape: BenchShape, precision: str,
                   device: torch.device) -> tuple[dict[float, int], float]:
    """Trials passed at each tolerance (the precision's, and KernelBench v0.1's), and the
    largest difference seen."""
    torch.manual_seed(SEED)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(CORRECTNESS_TRIALS)]
    tolerances = sorted({TOLERANCE[precision], FIRST_TOLERANCE})
    passed = dict.fromkeys(tolerances, 0)
    largest = 0.0
    with torch.no_grad():
        for seed in seeds:
            seed_everything(seed)
            inputs = on_device(get_inputs(shape), PRECISIONS[precision], device)
            output = model(*inputs)
            synchronize(device)
            output_new = model_new(*inputs)
            synchronize(device)
            if output.shape != output_new.shape:
                continue
            largest = max(largest, (output.float() - output_new.float()).abs().max().item())
            for tolerance in tolerances:
                passed[tolerance] += torch.allclose(output, output_new, atol=tolerance, rtol=tolerance)
    return passed, largest


def trial_ms(model: nn.Module, inputs: list[torch.Tensor], device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        model(*inputs)
        return (time.perf_counter() - start) * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.empty(L2_FLUSH_ELEMENTS, dtype=torch.int64, device=device).fill_(42)
    start.record()
    model(*inputs)
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end)


def runtime_ms(model: nn.Module, inputs: list[torch.Tensor], device: torch.device, *, warmup: int,
               trials: int) -> float:
    """KernelBench's runtime: the mean of `trials` timed calls after `warmup` ones and one
    dropped, to 3 significant digits."""
    for _ in range(warmup):
        model(*inputs)
        synchronize(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    times = []
    for _ in range(DISCARDED_TRIALS + trials):
        synchronize(device)
        times.append(trial_ms(model, inputs, device))
    return float(f"{statistics.mean(times[DISCARDED_TRIALS:]):.3g}")


def evaluate(model_classes: tuple[type[nn.Module], type[nn.Module]], shape: BenchShape, precision: str,
             device: torch.device, trials: int) -> None:
    dtype = PRECISIONS[precision]
    model, model_new = (build(cls, shape, dtype, device) for cls in model_classes)
    passed, largest = correct_trials(model, model_new, shape, precision, device)
    seed_everything(SEED)
    inputs = on_device(get_inputs(shape), dtype, device)
    new_ms = runtime_ms(model_new, inputs, device, warmup=WARMUP, trials=trials)  # grad mode, as KernelBench
    reference_ms = runtime_ms(model, inputs, device, warmup=WARMUP, trials=trials)
    with torch.no_grad():
        new_no_grad_ms = runtime_ms(model_new, inputs, device, warmup=REFERENCE_TIME_WARMUP, trials=trials)
        reference_no_grad_ms = runtime_ms(model, inputs, device, warmup=REFERENCE_TIME_WARMUP, trials=trials)
    counts = "".join(f"{passed[tolerance]}/{CORRECTNESS_TRIALS} at {tolerance:.0e}  " for tolerance in passed)
    print(f"{precision:<10}{counts:<28}{largest:>10.1e}{reference_ms:>10.3g}{new_ms:>10.3g}"
          f"{reference_ms / new_ms:>9.2f}   |{reference_no_grad_ms:>10.3g}{new_no_grad_ms:>10.3g}"
          f"{reference_no_grad_ms / new_no_grad_ms:>9.2f}", flush=True)


def load_example_models() -> tuple[type[nn.Module], type[nn.Module]]:
    spec = importlib.util.spec_from_file_location("kernelbench_61", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.Model, example.ModelNew


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--precisions", default="fp32,fp16,bf16", type=comma_list(tuple(PRECISIONS)),
                        help="comma-separated: fp32, fp16, bf16")
    parser.add_argument("--float32-mode", default="pytorch", choices=["pytorch", "tf32", "bf16x3"])
    parser.add_argument("--trials", type=positive_int, default=100,
                        help="timed calls per model (KernelBench's scripts: 100)")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the problem at one sample and a fraction of its size")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("kernelbench_harness.py: no CUDA device (`--device cpu --tiny` checks the script on the CPU)")
    shape = parse_shape("kb61").tiny() if args.tiny else parse_shape("kb61")
    where = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"KernelBench level2/61 ({describe(shape)}, no conv bias) on {where}, torch {torch.__version__}, "
          f"float32 mode {args.float32_mode!r}")
    print(f"correctness: {CORRECTNESS_TRIALS} trials under no_grad, allclose at the precision's tolerance and at "
          f"KernelBench v0.1's {FIRST_TOLERANCE:g}; runtime: mean ms of {args.trials} trials, models called in grad "
          "mode (KernelBench's); speedup = reference / ModelNew")
    print(f"{'precision':<10}{'correct':<28}{'max diff':>10}{'ref ms':>10}{'new ms':>10}{'speedup':>9}   |"
          f"{'ref ng':>10}{'new ng':>10}{'speedup':>9}  (no_grad)")
    model_classes = load_example_models()
    with cutlassfuse.float32_mode(args.float32_mode):
        for precision in args.precisions:
            evaluate(model_classes, shape, precision, device, args.trials)


if __name__ == "__main__":
    main()
