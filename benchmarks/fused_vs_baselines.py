"""One run, every ratio: the fused op against the same CUTLASS dgrad with a plain
store, cuDNN's convolution alone, PyTorch eager and torch.compile, on KernelBench
level2/61 (kb61) and its first version (kb61_v0); then each sm90 tile configuration.

    python benchmarks/fused_vs_baselines.py [--no-compile]

Medians of CUDA-event timings (cutlassfuse.benchmarking.median_ms) after warm-up;
fresh torch.rand inputs per shape and dtype.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.bench import parse_shape
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.testing import KernelBenchModel

SHAPES = ["kb61", "kb61_v0"]  # of cutlassfuse.bench.DEFAULT_SHAPES
COMPILE = "torch.compile (default)"


def time_ms(fn) -> float:
    return median_ms(fn, cuda=True, warmup=10, repeats=50)


def bench_shape(name: str, dtype: torch.dtype, with_compile: bool) -> dict[str, float]:
    shape = parse_shape(name)
    layer = (shape.in_channels, shape.out_channels, shape.kernel, shape.groups)
    torch.manual_seed(0)
    model = KernelBenchModel(*layer).cuda().to(dtype).eval()
    fused = cutlassfuse.ConvTranspose3dReLUGroupNorm(*layer).cuda().to(dtype).eval()
    fused.load_state_dict(model.state_dict())
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype)
    x_cl = x.contiguous(memory_format=torch.channels_last_3d)
    w = model.conv_transpose.weight
    t = {}
    with torch.no_grad():
        t["fused (module, NCDHW in)"] = time_ms(lambda: fused(x))
        t["fused (module, channels_last in)"] = time_ms(lambda: fused(x_cl))
        t["CUTLASS dgrad plain store (channels_last in)"] = time_ms(
            lambda: torch.ops.cutlassfuse.conv_transpose3d_cutlass(x_cl, w, None, None, None, shape.groups, 1e-5,
                                                                   [1] * 3, [0] * 3, [0] * 3, 1, [1] * 3, None))
        t["cuDNN conv_transpose3d (channels_last)"] = time_ms(lambda: F.conv_transpose3d(x_cl, w))
        t["cuDNN conv_transpose3d (NCDHW)"] = time_ms(lambda: F.conv_transpose3d(x, w))
        t["PyTorch eager"] = time_ms(lambda: model(x))
        if with_compile:
            compiled = torch.compile(model)
            compiled(x)
            t[COMPILE] = time_ms(lambda: compiled(x))
        for config in backends.dgrad_configs():
            with backends.flags(dgrad_config=config):
                t[f"fused {config} (NCDHW in)"] = time_ms(lambda: fused(x))
    return t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-compile", action="store_true")
    with_compile = not parser.parse_args().no_compile
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name in SHAPES:
        for dtype in (torch.float16, torch.bfloat16):
            t = bench_shape(name, dtype, with_compile and name == "kb61")
            fused = t["fused (module, NCDHW in)"]
            print(f"\n{name} {str(dtype).removeprefix('torch.')}")
            for label, ms in t.items():
                print(f"  {ms:8.3f} ms  {fused / ms if ms else 0:5.2f}x of fused time   {label}")
            plain = t["CUTLASS dgrad plain store (channels_last in)"]
            print(f"  fused(CL in) / plain CUTLASS = {t['fused (module, channels_last in)'] / plain:.3f}; "
                  f"fused(NCDHW in) / plain = {fused / plain:.3f}; eager / fused = {t['PyTorch eager'] / fused:.2f}"
                  + (f"; compile / fused = {t[COMPILE] / fused:.2f}" if COMPILE in t else ""))


if __name__ == "__main__":
    main()
