"""A video autoencoder's decoder accelerated with `cutlassfuse.fuse`: load it, fuse, decode.

    python examples/video_vae.py [--checkpoint hunyuanvideo-community/HunyuanVideo] [--device cpu]

diffusers' AutoencoderKLHunyuanVideo, from a checkpoint (a diffusers model directory or
hub id, its "vae" subfolder; without one randomly initialized: the model's own
configuration on a GPU, a small one on the CPU). torch.fx cannot trace the decoder whole
(its upsampling blocks branch on the number of frames), so fuse() traces it in parts: every
resnet block's GroupNorm -> SiLU and Conv3d -> GroupNorm -> SiLU and the decoder's last
GroupNorm -> SiLU become cutlassfuse blocks, the causal convolutions' replicate pads
cutlassfuse's pad (the pad of zeros before a 1x1x1 convolution is dropped). Prints fuse()'s
report, then decodes one latent with the decoder and its fused copy under torch.no_grad()
(GPU: bfloat16, a 16x5x32x32 latent, 17 frames of 256x256; CPU: float32, a 16x2x8x8
latent): the largest difference between their outputs, and their times.
"""

import argparse
import copy

import torch

import cutlassfuse
from cutlassfuse.benchmarking import print_fused_against_eager

try:
    from diffusers import AutoencoderKLHunyuanVideo
except ImportError as error:
    raise SystemExit(f"video_vae.py needs diffusers (pip install diffusers): {error}") from error

# On the CPU: the same architecture with fewer channels and one resnet per block.
SMALL = dict(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a diffusers model directory or hub id holding the autoencoder")
    parser.add_argument("--subfolder", default="vae", help="the autoencoder's folder in the checkpoint")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cuda: bfloat16, 17 frames of 256x256; cpu: float32, small")
    args = parser.parse_args()

    cuda = args.device == "cuda"
    device, dtype, latent_size = ("cuda", torch.bfloat16, (5, 32, 32)) if cuda else ("cpu", torch.float32, (2, 8, 8))
    torch.manual_seed(0)
    if args.checkpoint:
        vae = AutoencoderKLHunyuanVideo.from_pretrained(args.checkpoint, subfolder=args.subfolder)
    else:
        vae = AutoencoderKLHunyuanVideo(**({} if cuda else SMALL))
    decoder = vae.decoder.eval()
    result = cutlassfuse.fuse(copy.deepcopy(decoder))
    print(result)

    eager = decoder.to(device, dtype)
    fused = result.model.to(device, dtype)
    z = torch.randn(1, vae.config.latent_channels, *latent_size).to(device, dtype)
    print_fused_against_eager(eager, fused, z, str(dtype))


if __name__ == "__main__":
    main()
