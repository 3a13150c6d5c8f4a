"""A representative set of calls for compute-sanitizer (scripts/sanitize.sh): the fused
path in fp16 and bf16 with tiles straddling samples and groups crossing N tiles,
NCDHW and channels-last output, bias and no affine, and the reference path."""

import torch

import cutlassfuse

CASES = [
    # (batch, cin, cout, size, kernel, padding, groups, bias, affine, channels_last, dtype)
    (2, 16, 48, (5, 6, 7), 3, 1, 4, True, True, False, torch.float16),   # 12-channel groups; 210 rows per sample
    (3, 32, 192, (3, 3, 3), 3, 0, 4, False, True, True, torch.bfloat16),  # groups of 48 cross the 128-channel tile
    (32, 8, 16, (1, 1, 1), 1, 0, 16, True, False, False, torch.float16),  # one voxel per sample: 32 samples per tile
    (2, 3, 12, (4, 4, 4), 3, 1, 4, True, True, False, torch.float16),     # reference path (3 input channels)
]


def main() -> None:
    for batch, cin, cout, size, k, p, g, bias, affine, channels_last, dtype in CASES:
        x = torch.rand(batch, cin, *size, device="cuda", dtype=dtype)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        w = torch.randn(cin, cout, k, k, k, device="cuda", dtype=dtype) * 0.1
        args = dict(padding=p, num_groups=g,
                    norm_weight=torch.rand(cout, device="cuda", dtype=dtype) if affine else None,
                    norm_bias=torch.rand(cout, device="cuda", dtype=dtype) if affine else None)
        b = torch.randn(cout, device="cuda", dtype=dtype) if bias else None
        print(cutlassfuse.explain(x, w, b, **args))
        out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, b, **args)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all()


if __name__ == "__main__":
    main()
