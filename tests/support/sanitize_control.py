"""Control for initcheck (scripts/sanitize.sh): the STOCK CUTLASS sm90 dgrad, with no
cutlassfuse epilogue, writes its output through TMA bulk stores, and PyTorch then reads
that output. If initcheck reports this PyTorch read as uninitialized, it does not see
TMA stores, and its reports on reads of the fused kernel's activation (also written by
TMA stores) say nothing about our kernels. The GPU tests prove every element written
independently: they poison the allocator with NaN and check the outputs are finite."""

import torch

import cutlassfuse  # noqa: F401  (registers torch.ops.cutlassfuse)


def main() -> None:
    x = torch.rand(2, 16, 5, 6, 7, device="cuda", dtype=torch.float16).contiguous(memory_format=torch.channels_last_3d)
    w = torch.randn(16, 48, 3, 3, 3, device="cuda", dtype=torch.float16) * 0.1
    y = torch.ops.cutlassfuse.conv_transpose3d_cutlass(x, w, None, None, None, 4, 1e-5, [1] * 3, [1] * 3, [0] * 3, 1,
                                                       [1] * 3, None)
    print("stock CUTLASS dgrad output, read by PyTorch:", y.float().abs().sum().item())


if __name__ == "__main__":
    main()
