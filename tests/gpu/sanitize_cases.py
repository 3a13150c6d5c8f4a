"""A representative set of calls for compute-sanitizer (scripts/sanitize.sh): the fused
path in fp16 and bf16 with tiles straddling samples and groups crossing N tiles, CTAs
drawing their tiles (kb61_v0's 405), NCDHW and channels-last output, bias and no
affine, strided (sub-pixel phases, pixels no tap reaches, the pixel-shuffle GEMM),
float32 as bfloat16 piece products (opted in), and the CUDA fallback (odd channels,
conv groups, strict float32)."""

import torch

import cutlassfuse

CASES = [
    # (batch, cin, cout, size, kernel, stride, padding, conv groups, groups, bias, affine, channels_last, dtype)
    (2, 16, 48, (5, 6, 7), 3, 1, 1, 1, 4, True, True, False, torch.float16),   # 12-channel groups; 210 rows/sample
    (3, 32, 192, (3, 3, 3), 3, 1, 0, 1, 4, False, True, True, torch.bfloat16),  # 48-channel groups cross the N tile
    (32, 8, 16, (1, 1, 1), 1, 1, 0, 1, 16, True, False, False, torch.float16),  # 32 samples per tile
    (16, 64, 128, (8, 16, 16), 3, 1, 0, 1, 8, False, True, False, torch.float16),  # kb61_v0: CTAs draw tiles
    (2, 16, 32, (4, 5, 3), 4, 2, 1, 1, 8, True, True, False, torch.float16),    # 8 sub-pixel phases
    (2, 16, 32, (4, 5, 3), 1, 3, 0, 1, 4, True, True, True, torch.bfloat16),    # kernel < stride: unreached pixels
    (2, 3, 12, (4, 4, 4), 3, 1, 1, 1, 4, True, True, False, torch.float16),     # fallback: 3 input channels
    (2, 16, 32, (4, 4, 4), 3, 2, 1, 4, 8, True, True, True, torch.float16),     # fallback: conv groups
    (2, 16, 32, (4, 4, 4), 3, 2, 1, 1, 8, True, True, False, torch.float32),    # fp32 as 3 bf16 products
    (2, 16, 32, (4, 4, 4), 2, 2, 0, 1, 8, True, True, True, torch.float32),     # fp32 pixel-shuffle GEMM, CL
    (2, 5, 6, (4, 4, 4), 3, 2, 1, 1, 3, True, True, False, torch.float32),      # fallback: strict fp32
]


def main() -> None:
    cutlassfuse.set_float32_tensor_cores(True)  # the fused float32 cases; 5 channels still fall back
    for batch, cin, cout, size, k, stride, p, conv_groups, g, bias, affine, channels_last, dtype in CASES:
        x = torch.rand(batch, cin, *size, device="cuda", dtype=dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        w = torch.randn(cin, cout // conv_groups, k, k, k, device="cuda", dtype=dtype) * 0.1
        args = dict(stride=stride, padding=p, groups=conv_groups, num_groups=g,
                    norm_weight=torch.rand(cout, device="cuda", dtype=dtype) if affine else None,
                    norm_bias=torch.rand(cout, device="cuda", dtype=dtype) if affine else None)
        b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
        print(cutlassfuse.explain(x, w, b, **args))
        out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, b, **args)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()


if __name__ == "__main__":
    main()
