"""A representative set of calls for compute-sanitizer (scripts/sanitize.sh): the fused
path in fp16 and bf16 with tiles straddling samples and groups crossing N tiles, CTAs
drawing their tiles (kb61_v0's 405), NCDHW and channels-last output, bias and no
affine, strided (sub-pixel phases, pixels no tap reaches, the pixel-shuffle GEMM),
float32 in the "tf32" and "bf16x3" modes (opted in), and the CUDA fallback (odd
channels, conv groups, strict float32)."""

import torch

import cutlassfuse
from cutlassfuse.bench import parse_shape
from cutlassfuse.testing import make_inputs


F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
CASES = [  # make_inputs keywords
    # 12-channel groups; 210 rows per sample
    dict(batch=2, in_channels=16, out_channels=48, size=(5, 6, 7), kernel=3, padding=1, num_groups=4, dtype=F16),
    # 48-channel groups cross the N tile
    dict(batch=3, in_channels=32, out_channels=192, size=3, kernel=3, num_groups=4, bias=False, channels_last=True,
         dtype=BF16),
    # 32 samples per tile
    dict(batch=32, in_channels=8, out_channels=16, size=1, kernel=1, num_groups=16, affine=False, dtype=F16),
    # kb61_v0: CTAs draw their tiles
    dict(**parse_shape("kb61_v0").make_inputs_keywords(), bias=False, dtype=F16),
    # 8 sub-pixel phases
    dict(batch=2, in_channels=16, out_channels=32, size=(4, 5, 3), kernel=4, stride=2, padding=1, num_groups=8,
         dtype=F16),
    # kernel < stride: unreached pixels
    dict(batch=2, in_channels=16, out_channels=32, size=(4, 5, 3), kernel=1, stride=3, num_groups=4,
         channels_last=True, dtype=BF16),
    # fallback: 3 input channels
    dict(batch=2, in_channels=3, out_channels=12, size=4, kernel=3, padding=1, num_groups=4, dtype=F16),
    # fallback: conv groups
    dict(batch=2, in_channels=16, out_channels=32, size=4, kernel=3, stride=2, padding=1, groups=4, num_groups=8,
         channels_last=True, dtype=F16),
    # float32 in the opted-in modes (main): sub-pixel phases
    dict(batch=2, in_channels=16, out_channels=32, size=4, kernel=3, stride=2, padding=1, num_groups=8, dtype=F32),
    # float32 pixel-shuffle GEMM, channels-last
    dict(batch=2, in_channels=16, out_channels=32, size=4, kernel=2, stride=2, num_groups=8, channels_last=True,
         dtype=F32),
    # fallback: strict float32 (5 channels)
    dict(batch=2, in_channels=5, out_channels=6, size=4, kernel=3, stride=2, padding=1, num_groups=3, dtype=F32),
]


def main() -> None:
    # The fallback's float32 case strict, as PyTorch runs it with TF32 off (with it on,
    # racecheck reports hazards inside cuDNN's own TF32 dgrad kernel).
    for mode in ("tf32", "bf16x3"):  # the fused float32 cases; 5 channels still fall back
        with cutlassfuse.float32_mode(mode), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            for seed, case in enumerate(CASES):
                inputs = make_inputs(**case, device="cuda", seed=seed)
                print(cutlassfuse.explain(**inputs))
                out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
                torch.cuda.synchronize()
                assert torch.isfinite(out).all()


if __name__ == "__main__":
    main()
