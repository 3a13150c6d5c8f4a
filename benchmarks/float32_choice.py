"""float32: accuracy against float64 and against eager, and time, in one run, of
cutlassfuse's float32 modes (set_float32_mode: "pytorch", the default, with PyTorch's
TF32 conv switch on and off; "tf32", the fused path at TF32's precision; "bf16x3", the
fused path running three bfloat16 piece products) and PyTorch eager with TF32 on (its
default) and off. The evidence for the float32 modes (docs/performance.md).

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

    def in_mode(mode):
        def run():
            with cutlassfuse.float32_mode(mode):
                return ours()
        return run

    print(f"{shape.name} float32 on {torch.cuda.get_device_name()}")
    print(f"{'implementation':<40}{'median ms':>10}{'max abs vs fp64':>17}{'max abs vs eager':>18}")
    rows = [("cutlassfuse 'pytorch', TF32 allowed", ours, True), ("eager, TF32 allowed (default)", eager, True),
            ("cutlassfuse 'pytorch', strict fp32", ours, False), ("eager, strict fp32", eager, False),
            ("cutlassfuse 'tf32'", in_mode("tf32"), True), ("cutlassfuse 'bf16x3'", in_mode("bf16x3"), True)]
    for name, fn, tf32 in rows:
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=tf32), torch.no_grad():
            out, same_setting_eager = fn(), eager()
            ms = median_ms(fn, cuda=True, warmup=3, repeats=10)
        against_eager = (out - same_setting_eager).abs().max().item()
        print(f"{name:<40}{ms:10.3f}{errors(out, reference).max_abs:17.2e}{against_eager:18.2e}")


if __name__ == "__main__":
    main()
