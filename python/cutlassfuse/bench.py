"""`python -m cutlassfuse bench`: the fused op (and its CUDA fallback, timed with the
fused path turned off) against PyTorch eager, torch.compile,
cuDNN's convolution alone and the same CUTLASS convolution with a plain store, on the
shapes of docs (or given ones), all ratios from one run.

Every row but two runs under torch.no_grad(); "eager (grad mode)" and "cutlassfuse
(grad mode)" call the same layers as most PyTorch code does, tracked by autograd: the
parameters require grad, no torch.no_grad(), the output discarded without a backward.

Timing: CUDA events around each call, medians and the 20th-80th percentile spread,
after warm-up; each call reads the next of several input copies whose total exceeds
twice the L2 cache, so repeated calls do not run out of cache.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import json
import itertools
import statistics
from dataclasses import asdict, dataclass
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .benchmarking import times_ms
from .modules import ConvTranspose3dReLUGroupNorm
from . import backends
from .ops import float32_mode, transposed_conv_output_size
from .testing import reference_float64

# Measured on H200 (docs/performance.md): fp16/bf16 dense matmul and copy bandwidth.
TENSOR_CEILING_TFLOPS = {torch.float16: 693.0, torch.bfloat16: 716.0, torch.float32: 495.0}
COPY_CEILING_GBS = 4270.0


@dataclass(frozen=True)
class BenchShape:
    name: str
    batch: int
    in_channels: int
    out_channels: int
    size: tuple[int, int, int]
    kernel: int
    stride: int
    padding: int
    output_padding: int
    groups: int

    def output_size(self) -> tuple[int, ...]:
        def triple(value: int) -> tuple[int, int, int]:
            return (value,) * 3

        return tuple(transposed_conv_output_size(self.size, triple(self.kernel), triple(self.stride),
                                                 triple(self.padding), triple(self.output_padding), triple(1)))

    def make_inputs_keywords(self) -> dict:
        """The layer's shape as keywords of cutlassfuse.testing.make_inputs."""
        return dict(batch=self.batch, in_channels=self.in_channels, out_channels=self.out_channels, size=self.size,
                    kernel=self.kernel, stride=self.stride, padding=self.padding,
                    output_padding=self.output_padding, num_groups=self.groups)

    def tiny(self) -> BenchShape:
        """The same layer at a size for checking the command itself (CPU, CI): one sample,
        a quarter of the channels (whole GroupNorm groups), an eighth of the extent."""
        out_channels = max(self.groups, self.out_channels // 4 // self.groups * self.groups)
        return BenchShape(f"{self.name}-tiny", 1, max(1, self.in_channels // 4), out_channels,
                          tuple(max(2, s // 8) for s in self.size), self.kernel, self.stride, self.padding,
                          self.output_padding, self.groups)

    def useful_flops(self) -> float:
        voxels = self.size[0] * self.size[1] * self.size[2]
        return 2.0 * self.batch * self.in_channels * voxels * self.out_channels * self.kernel**3

    def min_bytes(self, element_size: int) -> float:
        out = self.output_size()
        numel = (self.batch * self.in_channels * self.size[0] * self.size[1] * self.size[2]
                 + self.batch * self.out_channels * out[0] * out[1] * out[2]
                 + self.in_channels * self.out_channels * self.kernel**3)
        return float(numel * element_size)


# The benchmark layers: KernelBench level2/61 and its smaller variant, a 3D U-Net
# upsampling stage, a GAN generator stage and a video decoder stage.
DEFAULT_SHAPES = [
    BenchShape("kb61", 16, 64, 128, (32, 32, 32), 3, 1, 0, 0, 8),
    BenchShape("kb61_v0", 16, 64, 128, (8, 16, 16), 3, 1, 0, 0, 8),
    BenchShape("unet_k2s2", 2, 256, 128, (24, 24, 24), 2, 2, 0, 0, 8),
    BenchShape("gan_k4s2p1", 32, 256, 128, (8, 8, 8), 4, 2, 1, 0, 32),
    BenchShape("vid_k3s2p1op1", 4, 128, 64, (8, 32, 32), 3, 2, 1, 1, 16),
]


def parse_shape(text: str) -> BenchShape:
    """A named default, or N,Cin,Cout,D,H,W,kernel,stride,padding,output_padding,groups."""
    for shape in DEFAULT_SHAPES:
        if text == shape.name:
            return shape
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:  # neither a name nor numbers
        values = []
    if len(values) != 11:
        raise ValueError(f"shape {text!r}: give a name ({', '.join(s.name for s in DEFAULT_SHAPES)}) or "
                         "N,Cin,Cout,D,H,W,kernel,stride,padding,output_padding,groups")
    n, cin, cout, d, h, w, k, s, p, op, g = values
    return BenchShape(text, n, cin, cout, (d, h, w), k, s, p, op, g)


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float


def rotating_inputs(shape: BenchShape, dtype: torch.dtype, device: torch.device,
                    memory_format: torch.memory_format = torch.contiguous_format) -> list[torch.Tensor]:
    """The layer's inputs, as `rotating_tensors`."""
    return rotating_tensors((shape.batch, shape.in_channels, *shape.size), dtype, device, memory_format)


def rotating_tensors(size: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                     memory_format: torch.memory_format = torch.contiguous_format) -> list[torch.Tensor]:
    """torch.rand tensors of `size`, as many copies (up to 16) as it takes on a GPU for
    their total to exceed twice a 60 MB L2; one on the CPU."""
    one = torch.rand(*size, device=device, dtype=dtype)
    copies = max(1, min(16, int(2 * 60e6 // (one.numel() * one.element_size())) + 1)) if device.type == "cuda" else 1
    return [torch.rand_like(one).contiguous(memory_format=memory_format) for _ in range(copies)]


def time_rotating(fn: Callable[[torch.Tensor], object], inputs: list[torch.Tensor], warmup: int,
                  repeats: int) -> Timing:
    """Per-call times, each call reading the next of `inputs`."""
    rotation = itertools.cycle(inputs)
    samples = sorted(times_ms(lambda: fn(next(rotation)), cuda=inputs[0].is_cuda, warmup=warmup, repeats=repeats))
    return Timing(statistics.median(samples), samples[len(samples) // 5], samples[(4 * len(samples)) // 5])


@dataclass
class Row:
    """One implementation on one case; the numbers are None where it does not apply
    (`note` says why)."""

    shape: str
    dtype: str
    memory_format: str
    implementation: str
    median_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    tflops: float | None = None
    pct_tensor_ceiling: float | None = None
    gbs: float | None = None
    speedup_of_fused: float | None = None  # this implementation's time / fused time
    max_abs_vs_float64: float | None = None  # of the whole block's output; None for the conv alone
    note: str = ""


def layer_models(shape: BenchShape, dtype: torch.dtype,
            device: torch.device) -> tuple[nn.Module, ConvTranspose3dReLUGroupNorm]:
    """The layers as a PyTorch user builds them: nn.ConvTranspose3d's defaults (with
    bias), ReLU, nn.GroupNorm; the fused block holds the same parameters."""
    torch.manual_seed(0)
    eager = nn.Sequential(
        nn.ConvTranspose3d(shape.in_channels, shape.out_channels, shape.kernel, stride=shape.stride,
                           padding=shape.padding, output_padding=shape.output_padding),
        nn.ReLU(), nn.GroupNorm(shape.groups, shape.out_channels)).to(device=device, dtype=dtype).eval()
    fused = ConvTranspose3dReLUGroupNorm.from_modules(eager[0], eager[2])
    return eager, fused


def _not_applicable(implementation: str, dtype: torch.dtype, device: torch.device) -> str:
    """Why a baseline does not run for this dtype and device; '' when it does."""
    if implementation in ("cuDNN conv alone", "cutlassfuse fallback") and device.type != "cuda":
        return "CUDA only"
    if implementation in ("cutlassfuse tf32", "cutlassfuse bf16x3") and (
            device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0)):
        return "the fused path runs on sm_90 GPUs"
    if implementation == "CUTLASS conv alone":
        if not hasattr(torch.ops.cutlassfuse, "conv_transpose3d_cutlass"):
            return "a build without the baseline kernels (CUTLASSFUSE_BASELINE_KERNELS=ON builds them)"
        if device.type != "cuda" or torch.cuda.get_device_capability(device) != (9, 0):
            return "sm_90 GPUs only"
        if dtype not in (torch.float16, torch.bfloat16):
            return "float16 and bfloat16 only"
    return ""


@dataclass(frozen=True)
class Candidate:
    fn: Callable[[torch.Tensor], object]
    setting: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    whole_op: bool = True  # computes the whole block (its error against float64 is reported)
    grad_mode: bool = False  # called with autograd on (the parameters require grad), else under no_grad


def _strict_float32():
    return torch.backends.cudnn.flags(enabled=True, allow_tf32=False)


def _candidates(shape: BenchShape, dtype: torch.dtype, eager: nn.Module, fused: nn.Module,
                with_compile: bool) -> dict[str, Candidate]:
    """What one case times: PyTorch (eager, compiled), the convolution alone (cuDNN; the
    same CUTLASS kernel with plain stores), cutlassfuse's fallback and fused call; for
    float32 also PyTorch's strict setting and the "tf32" and "bf16x3" modes; then eager
    and the fused call in grad mode."""
    conv = eager[0]
    conv_args = dict(stride=conv.stride, padding=conv.padding, output_padding=conv.output_padding)

    def cutlass_conv(x):  # every sub-pixel phase, plain stores, no bias
        return torch.ops.cutlassfuse.conv_transpose3d_cutlass(
            x, conv.weight, conv.bias, None, None, shape.groups, 1e-5, [shape.stride] * 3, [shape.padding] * 3,
            [shape.output_padding] * 3, 1, [1] * 3, None)

    candidates = {"pytorch eager": Candidate(eager)}
    if dtype == torch.float32:
        candidates["pytorch eager, TF32 off"] = Candidate(eager, _strict_float32)
    candidates["cuDNN conv alone"] = Candidate(lambda x: F.conv_transpose3d(x, conv.weight, conv.bias, **conv_args),
                                               whole_op=False)
    if with_compile:
        torch._dynamo.reset()  # every case compiles afresh instead of piling up recompilations
        candidates["torch.compile"] = Candidate(torch.compile(eager))
    candidates["CUTLASS conv alone"] = Candidate(cutlass_conv, whole_op=False)
    candidates["cutlassfuse fallback"] = Candidate(fused, lambda: backends.flags(fused_path=False))
    if dtype == torch.float32:
        candidates["cutlassfuse, TF32 off"] = Candidate(fused, _strict_float32)
        candidates["cutlassfuse tf32"] = Candidate(fused, lambda: float32_mode("tf32"))
        candidates["cutlassfuse bf16x3"] = Candidate(fused, lambda: float32_mode("bf16x3"))
    candidates["cutlassfuse"] = Candidate(fused)
    candidates["eager (grad mode)"] = Candidate(eager, grad_mode=True)
    candidates["cutlassfuse (grad mode)"] = Candidate(fused, grad_mode=True)
    return candidates


def _max_abs_error(candidate: Candidate, x: torch.Tensor, reference: torch.Tensor) -> float | None:
    if not candidate.whole_op:
        return None
    return (candidate.fn(x).double() - reference).abs().max().item()


def bench_case(shape: BenchShape, dtype: torch.dtype, channels_last: bool, *, with_compile: bool, warmup: int,
               repeats: int, device: torch.device | None = None) -> list[Row]:
    device = device or torch.device("cuda")
    eager, fused = layer_models(shape, dtype, device)
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    inputs = rotating_inputs(shape, dtype, device, memory_format)
    case = (shape.name, str(dtype).removeprefix("torch."), "channels_last" if channels_last else "ncdhw")
    conv, norm = eager[0], eager[2]
    reference = reference_float64(inputs[0], conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding,
                                  num_groups=norm.num_groups, norm_weight=norm.weight, norm_bias=norm.bias,
                                  eps=norm.eps)

    results: dict[str, tuple[Timing, float | None] | str] = {}
    for name, candidate in _candidates(shape, dtype, eager, fused, with_compile).items():
        results[name] = _not_applicable(name, dtype, device)
        if results[name]:
            continue
        try:
            with torch.set_grad_enabled(candidate.grad_mode), candidate.setting():
                results[name] = (time_rotating(candidate.fn, inputs, warmup, repeats),
                                 _max_abs_error(candidate, inputs[0], reference))
        except (RuntimeError, ValueError) as error:  # a baseline refusing this problem
            results[name] = f"refused: {str(error).splitlines()[0]}"
    fused_ms = results["cutlassfuse"][0].median_ms
    rows = []
    for name, result in results.items():
        if isinstance(result, str):
            rows.append(Row(*case, name, note=f"n/a: {result}"))
            continue
        t, error = result
        tflops = shape.useful_flops() / (t.median_ms * 1e-3) / 1e12
        ceiling = TENSOR_CEILING_TFLOPS.get(dtype) if device.type == "cuda" else None
        rows.append(Row(*case, name, t.median_ms, t.p20_ms, t.p80_ms, tflops,
                        100 * tflops / ceiling if ceiling else None,
                        shape.min_bytes(inputs[0].element_size()) / (t.median_ms * 1e-3) / 1e9, t.median_ms / fused_ms,
                        max_abs_vs_float64=error))
    return rows


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        if r.median_ms is None:
            print(f"    {r.implementation:<24}{'n/a':>9}    ({r.note.removeprefix('n/a: ')})")
            continue
        ceiling = f" ({r.pct_tensor_ceiling:4.1f}%)" if r.pct_tensor_ceiling is not None else ""
        error = f"   max abs vs fp64 {r.max_abs_vs_float64:.1e}" if r.max_abs_vs_float64 is not None else ""
        print(f"    {r.implementation:<24}{r.median_ms:9.3f} ms [{r.p20_ms:.3f}-{r.p80_ms:.3f}]"
              f"{r.tflops:8.1f} TFLOP/s{ceiling}{r.gbs:8.0f} GB/s   fused is {r.speedup_of_fused:.2f}x faster{error}")


def write_outputs(rows: list[Row], device_name: str, csv_path: str | None, json_path: str | None,
                  plot_path: str | None) -> None:
    records = [asdict(r) for r in rows]
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    if json_path:
        meta = {"device": device_name, "torch": torch.__version__, "cuda": torch.version.cuda,
                "date": datetime.date.today().isoformat()}
        with open(json_path, "w") as f:
            json.dump({"environment": meta, "rows": records}, f, indent=2)
    if plot_path:
        plot_speedups(rows, device_name, plot_path)


def plot_speedups(rows: list[Row], device_name: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys((r.shape, r.dtype, r.memory_format) for r in rows))  # in run order
    baselines = ["pytorch eager", "torch.compile", "cuDNN conv alone"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(cases)), 4.5))
    width = 0.8 / len(baselines)
    for i, baseline in enumerate(baselines):
        values = [next((r.speedup_of_fused or 0.0 for r in rows if (r.shape, r.dtype, r.memory_format) == c
                        and r.implementation == baseline), 0.0) for c in cases]
        ax.bar([k + i * width for k in range(len(cases))], values, width, label=f"vs {baseline}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([k + width for k in range(len(cases))])
    ax.set_xticklabels([f"{s}\n{d}\n{m}" for s, d, m in cases], fontsize=8)
    ax.set_ylabel("cutlassfuse speedup (x)")
    ax.set_title(f"cutlassfuse on {device_name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run_bench(shapes: list[BenchShape], dtypes: list[torch.dtype], channels_last_options: list[bool], *,
              with_compile: bool = True, warmup: int = 10, repeats: int = 50, csv_path: str | None = None,
              json_path: str | None = None, plot_path: str | None = None, device: str = "cuda",
              tiny: bool = False) -> list[Row]:
    """Every shape x dtype x memory format; `tiny` shrinks the shapes (BenchShape.tiny)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cutlassfuse bench: no CUDA device (`--device cpu --tiny` checks the command on the CPU)")
    shapes = [shape.tiny() for shape in shapes] if tiny else shapes
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    total = len(shapes) * len(dtypes) * len(channels_last_options)
    print(f"cutlassfuse bench on {where}, torch {torch.__version__}; {total} cases")
    rows: list[Row] = []
    done = 0
    for shape in shapes:
        for dtype in dtypes:
            for channels_last in channels_last_options:
                done += 1
                print(f"[{done}/{total}] {shape.name} {str(dtype).removeprefix('torch.')} "
                      f"{'channels_last' if channels_last else 'ncdhw'}", flush=True)
                case_rows = bench_case(shape, dtype, channels_last, with_compile=with_compile, warmup=warmup,
                                       repeats=repeats, device=torch.device(device))
                print_rows(case_rows)
                rows += case_rows
    write_outputs(rows, where, csv_path, json_path, plot_path)
    return rows
