"""One training step of each benchmark layer: forward, then backward with a given output
gradient, every parameter's gradient and the input's. cutlassfuse's module against the
PyTorch modules it replaces (ConvTranspose3d with its default bias, ReLU, GroupNorm:
eager, and torch.compile of them), and with recompute=True ("recompute"), all holding
the same parameters: the median over alternating rounds of each model's steady-state
step time (``loop_ms``: back-to-back steps between two synchronizations, as a training
loop runs them), the memory kept from forward to backward (beyond the output) and the
step's peak, with the max abs difference of the input gradient from eager's.

    python benchmarks/training_step.py [--shapes kb61,unet_k2s2] [--dtypes float16,bfloat16] [--no-compile]
    python benchmarks/training_step.py --device cpu --tiny   # checks the script where there is no GPU
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch import nn

from cutlassfuse import ConvTranspose3dReLUGroupNorm
from cutlassfuse.bench import DEFAULT_SHAPES, BenchShape, layer_models, parse_shape
from cutlassfuse.benchmarking import loop_ms

ROUNDS = 5


def step_fn(model: nn.Module, x: torch.Tensor, grad: torch.Tensor):
    def step() -> None:
        x.grad = None
        model.zero_grad(set_to_none=True)
        model(x).backward(grad)

    return step


def memory_mib(model: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> tuple[float, float]:
    """Memory kept from forward to backward beyond the output, and the step's peak above
    what was allocated before it (MiB; CUDA only)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = model(x)
    kept = torch.cuda.memory_allocated() - base - out.numel() * out.element_size()
    out.backward(grad)
    torch.cuda.synchronize()
    return kept / 2**20, (torch.cuda.max_memory_allocated() - base) / 2**20


def run_case(shape: BenchShape, dtype: torch.dtype, device: torch.device, *, with_compile: bool,
             repeats: int) -> None:
    eager, fused = layer_models(shape, dtype, device)
    eager.train()
    fused.train()
    recompute = ConvTranspose3dReLUGroupNorm.from_modules(eager[0], eager[2], recompute=True)
    models = {"eager": eager, "cutlassfuse": fused, "recompute": recompute}
    if with_compile:
        models["torch.compile"] = torch.compile(eager)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device=device, dtype=dtype, generator=generator)
    x.requires_grad_()
    grad = torch.randn(shape.batch, shape.out_channels, *shape.output_size(), device=device, dtype=dtype,
                       generator=generator)
    cuda = device.type == "cuda"
    # Alternating rounds, so that a slow spell of the host or the GPU falls on every model.
    rounds: dict[str, list[float]] = {name: [] for name in models}
    input_grads = {}
    for _ in range(ROUNDS):
        for name, model in models.items():
            rounds[name].append(loop_ms(step_fn(model, x, grad), cuda=cuda, warmup=3, repeats=repeats))
            input_grads[name] = x.grad.detach().clone()
    times = {name: statistics.median(values) for name, values in rounds.items()}
    label = f"{shape.name} {str(dtype).removeprefix('torch.')}"
    for name in models:
        memory = "".join(f"{mib:>10.1f}" for mib in memory_mib(models[name], x, grad)) if cuda else f"{'n/a':>20}"
        diff = (input_grads[name].float() - input_grads["eager"].float()).abs().max().item()
        print(f"{label:<28}{name:<15}{times[name]:>9.3f}{times['eager'] / times[name]:>9.2f}x{memory}{diff:>12.2e}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(s.name for s in DEFAULT_SHAPES))
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="each shape at one sample and a fraction of its size")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--repeats", type=int, default=10, help="steps timed per model and round")
    args = parser.parse_args()
    device = torch.device(args.device)
    shapes = [parse_shape(name) for name in args.shapes.split(",")]
    if args.tiny:
        shapes = [shape.tiny() for shape in shapes]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}; ms per step, speedup over eager, MiB kept for backward and peak")
    print(f"{'layer':<28}{'impl':<15}{'step ms':>9}{'vs eager':>10}{'kept MiB':>10}{'peak MiB':>10}"
          f"{'dx vs eager':>12}")
    for shape in shapes:
        for dtype in (getattr(torch, d) for d in args.dtypes.split(",")):
            run_case(shape, dtype, device, with_compile=not args.no_compile, repeats=args.repeats)


if __name__ == "__main__":
    main()
