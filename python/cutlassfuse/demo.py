"""`python -m cutlassfuse demo`: the KernelBench level2/61 problem through cutlassfuse
and through plain PyTorch, with errors against float64 and timings."""

from __future__ import annotations

import torch

from .bench import BenchShape, parse_shape
from .benchmarking import median_ms
from .modules import ConvTranspose3dReLUGroupNorm
from .ops import explain
from .testing import KernelBenchModel, errors, reference_float64

KERNELBENCH_61 = parse_shape("kb61")
# Small enough for the float64 reference and a few timed runs on a laptop CPU.
CPU_DEMO = BenchShape("kb61_cpu", 2, 16, 32, (8, 8, 8), 3, 1, 0, 0, 8)


def describe(shape: BenchShape) -> str:
    d, h, w = shape.size
    return (f"batch {shape.batch}, {shape.in_channels} -> {shape.out_channels} channels, {d}x{h}x{w}, "
            f"kernel {shape.kernel}, {shape.groups} groups")


def _models(shape: BenchShape, device: torch.device, dtype: torch.dtype):
    args = (shape.in_channels, shape.out_channels, shape.kernel, shape.groups)
    torch.manual_seed(0)
    fused = ConvTranspose3dReLUGroupNorm(*args).to(device, dtype)
    torch.manual_seed(0)
    original = KernelBenchModel(*args).to(device, dtype)
    return fused, original


def run_demo(device: torch.device | None = None, dtypes: tuple[torch.dtype, ...] | None = None) -> list[dict]:
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    device = torch.device("cuda" if cuda else "cpu") if device is None else device
    shape = KERNELBENCH_61 if cuda else CPU_DEMO
    dtypes = dtypes or ((torch.float16, torch.bfloat16) if cuda else (torch.float32,))
    where = torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA device: reduced size)"
    print(f"cutlassfuse demo: KernelBench level2/61, {describe(shape)}, on {where}")

    rows = []
    for dtype in dtypes:
        fused, original = _models(shape, device, dtype)
        x = torch.rand(shape.batch, shape.in_channels, *shape.size, device=device, dtype=dtype)
        with torch.no_grad():
            conv, norm = fused.conv_transpose, fused.group_norm
            reference = reference_float64(x, conv.weight, conv.bias, num_groups=norm.num_groups,
                                          norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps)
            path = explain(x, conv.weight, conv.bias, num_groups=norm.num_groups, norm_weight=norm.weight,
                           norm_bias=norm.bias, eps=norm.eps)
            for name, model in (("cutlassfuse", fused), ("pytorch", original)):
                err = errors(model(x), reference)
                ms = median_ms(lambda: model(x), cuda=cuda, warmup=5 if cuda else 1, repeats=50 if cuda else 3)
                rows.append({"dtype": str(dtype).removeprefix("torch."), "impl": name, "relative_error": err.relative,
                             "max_abs_error": err.max_abs, "ms": ms})
        print(f"  {str(dtype).removeprefix('torch.')}: {path}")
        del reference

    print(f"\n{'dtype':<10}{'implementation':<16}{'rel err':>10}{'max abs':>10}{'ms':>10}{'speedup':>9}")
    for row in rows:
        baseline = next(r["ms"] for r in rows if r["dtype"] == row["dtype"] and r["impl"] == "pytorch")
        print(f"{row['dtype']:<10}{row['impl']:<16}{row['relative_error']:>10.2e}{row['max_abs_error']:>10.2e}"
              f"{row['ms']:>10.3f}{baseline / row['ms']:>8.2f}x")
    return rows
