"""Forward + backward of KernelBench level2/61 (the benchmark shape kb61; fp16, bf16):
time and peak memory of cutlassfuse (saves only the inputs, recomputes the activation in
backward) against PyTorch eager (keeps the conv output and the ReLU output for backward).

    python benchmarks/training_step.py
"""

import torch

import cutlassfuse
from cutlassfuse.bench import parse_shape
from cutlassfuse.benchmarking import median_ms
from cutlassfuse.testing import KernelBenchModel


def measure(model, x, grad):
    def step():
        x.grad = None
        model.zero_grad(set_to_none=True)
        model(x).backward(grad)

    ms = median_ms(step, cuda=True, warmup=3, repeats=20)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = model(x)
    forward_peak = torch.cuda.max_memory_allocated() - base
    kept = torch.cuda.memory_allocated() - base - out.numel() * out.element_size()
    out.backward(grad)
    torch.cuda.synchronize()
    return ms, kept / 2**20, (torch.cuda.max_memory_allocated() - base) / 2**20, forward_peak / 2**20


def main():
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'dtype':<10}{'impl':<14}{'fwd+bwd ms':>11}{'saved MiB':>11}{'peak MiB':>10}")
    shape = parse_shape("kb61")
    layer = (shape.in_channels, shape.out_channels, shape.kernel, shape.groups)
    for dtype in (torch.float16, torch.bfloat16):
        torch.manual_seed(0)
        eager = KernelBenchModel(*layer).cuda().to(dtype)
        fused = cutlassfuse.ConvTranspose3dReLUGroupNorm(*layer).cuda().to(dtype)
        fused.load_state_dict(eager.state_dict())
        x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda", dtype=dtype, requires_grad=True)
        grad = torch.randn(shape.batch, shape.out_channels, *shape.output_size(), device="cuda", dtype=dtype)
        for name, model in (("eager", eager), ("cutlassfuse", fused)):
            ms, kept, peak, _ = measure(model, x, grad)
            print(f"{str(dtype).removeprefix('torch.'):<10}{name:<14}{ms:>11.3f}{kept:>11.1f}{peak:>10.1f}")


if __name__ == "__main__":
    main()
