"""float32: accuracy against float64 and time, in one run, of cutlassfuse's two float32
implementations (the fused path running three bfloat16 piece products, opted in with
set_float32_tensor_cores; the default, cuDNN in strict fp32 on the CUDA fallback) and
PyTorch eager with its default TF32 convolution and with TF32 off. The evidence for the
fp32 implementation choice (docs/performance.md).

    python benchmarks/float32_choice.py [--shape kb61]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.bench import parse_shape
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.testing import errors, reference_float64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="kb61")
    shape = parse_shape(parser.parse_args().shape)
    torch.manual_seed(0)
    k = shape.kernel
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda")
    w = torch.randn(shape.in_channels, shape.out_channels, k, k, k, device="cuda") * (shape.in_channels * k**3) ** -0.5
    args = dict(stride=shape.stride, padding=shape.padding, output_padding=shape.output_padding)
    reference = reference_float64(x, w, num_groups=shape.groups, **args)

    def eager():
        return F.group_norm(F.relu(F.conv_transpose3d(x, w, **args)), shape.groups)

    def ours():
        return cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=shape.groups, **args)

    def ours_tensor_cores():
        cutlassfuse.set_float32_tensor_cores(True)
        try:
            return ours()
        finally:
            cutlassfuse.set_float32_tensor_cores(False)

    path = cutlassfuse.explain(x, w, num_groups=shape.groups, **args)
    print(f"{shape.name} float32 on {torch.cuda.get_device_name()}: {path}")
    print(f"{'implementation':<42}{'median ms':>10}{'max abs err':>13}{'rel err':>10}")
    saved = torch.backends.cudnn.allow_tf32
    try:
        for name, fn, tf32 in [("cutlassfuse tensor cores (3 bf16 products)", ours_tensor_cores, saved),
                               ("cutlassfuse default (strict fp32 cuDNN)", ours, saved),
                               ("eager, TF32 conv (PyTorch default)", eager, True),
                               ("eager, strict fp32", eager, False)]:
            torch.backends.cudnn.allow_tf32 = tf32
            with torch.no_grad():
                err = errors(fn(), reference)
                ms = median_ms(fn, cuda=True, warmup=3, repeats=10)
            print(f"{name:<42}{ms:10.3f}{err.max_abs:13.2e}{err.relative:10.2e}")
    finally:
        torch.backends.cudnn.allow_tf32 = saved


if __name__ == "__main__":
    main()
