"""A diffusers video autoencoder's decoder through `cutlassfuse.fuse`: eager against the
fused decoder (the activations in the input's layout, fuse()'s default, and channels-last),
with --compile also torch.compile of the decoder and of the fused decoder, under
torch.no_grad() with random weights at the model's own configuration; with --grad-mode also
eager and the fused decoder called in grad mode, as scripts call a model without
torch.no_grad() (parameters requiring grad, no backward). --vae picks the autoencoder:
HunyuanVideo (its decoder called on the latent, default), CogVideoX, Wan, Mochi, LTX-Video
(each through `vae.decode`, whose frame batches and caches their decoders need). Per dtype:
the median ms over alternating rounds (each a median of --repeats calls on fresh latents),
the kernel time per call split into convolutions, norms and the rest (torch.profiler, under
torch.no_grad()), of it the replicate pads' kernels (ATen's replication_pad3d, or
cutlassfuse's), and each decoder's max abs error against a float64 copy of it on one latent.
Needs diffusers.

    python benchmarks/video_vae.py [--vae hunyuanvideo] [--dtypes float16,bfloat16] [--latent 5,32,32]
                                   [--compile] [--grad-mode]
    python benchmarks/video_vae.py --device cpu --dtypes float32 --latent 2,8,8   # checks it without a GPU
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass

import torch

import cutlassfuse
from cutlassfuse.__main__ import DTYPES, comma_list, positive_int
from cutlassfuse.bench import rotating_tensors
from cutlassfuse.block_bench import Timed, medians_over_rounds
from cutlassfuse.network_bench import kernel_split_ms

try:
    import diffusers
except ImportError as error:
    raise SystemExit(f"video_vae.py needs diffusers (pip install diffusers): {error}") from error


@dataclass(frozen=True)
class VideoVAE:
    cls: str  # diffusers' class
    small: dict  # on the CPU: the same architecture with fewer channels and layers
    latent: str  # the default latent's frames,height,width
    whole_decoder: bool  # the decoder called on the latent, or vae.decode (frame batches, caches)


VAES = {
    "hunyuanvideo": VideoVAE("AutoencoderKLHunyuanVideo",
                             dict(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1),
                             "5,32,32", True),
    "cogvideox": VideoVAE("AutoencoderKLCogVideoX",
                          dict(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1),
                          "3,32,32", False),
    "wan": VideoVAE("AutoencoderKLWan", dict(base_dim=32, num_res_blocks=1), "3,32,32", False),
    "mochi": VideoVAE("AutoencoderKLMochi",
                      dict(decoder_block_out_channels=(32, 32, 64, 64), layers_per_block=(1, 1, 1, 1, 1)),
                      "3,32,32", False),
    "ltx": VideoVAE("AutoencoderKLLTXVideo",
                    dict(decoder_block_out_channels=(32, 32, 64, 64), decoder_layers_per_block=(1, 1, 1, 1, 1)),
                    "3,16,16", False),
}


class Decoding(torch.nn.Module):
    """`vae.decode(latent).sample` as a module: a copy of `vae` with `decoder` (itself, not
    a copy) in place of its own."""

    def __init__(self, vae: torch.nn.Module, decoder: torch.nn.Module):
        super().__init__()
        self.vae = copy.deepcopy(vae, memo={id(vae.decoder): decoder})

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.vae.decode(latent).sample


def decoding(spec: VideoVAE, vae: torch.nn.Module, decoder: torch.nn.Module) -> torch.nn.Module:
    return decoder if spec.whole_decoder else Decoding(vae, decoder)


def pad_ms(model: torch.nn.Module, x: torch.Tensor) -> float:
    """The time per call under torch.no_grad() of the replicate pads: kernels (ATen's and
    cutlassfuse's NCDHW rows kernel say replication_pad, cutlassfuse's gathers PadGrid), or
    on the CPU ops, whose names say replication_pad."""
    def kind(name: str) -> str:
        return "pad" if "replication_pad" in name or "PadGrid" in name else "rest"
    return kernel_split_ms(model, [x], kind).get("pad", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vae", choices=sorted(VAES), default="hunyuanvideo")
    parser.add_argument("--dtypes", default="float16,bfloat16", type=comma_list(DTYPES))
    parser.add_argument("--latent", help="the latent's frames,height,width (default: the autoencoder's entry in VAES)")
    parser.add_argument("--grad-mode", action="store_true",
                        help="also eager and fuse called in grad mode (parameters requiring grad, no backward)")
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile of the decoder and of the fused decoder (minutes)")
    parser.add_argument("--repeats", type=positive_int, default=5)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: a small configuration (checks the script)")
    args = parser.parse_args()

    device = torch.device(args.device)
    spec = VAES[args.vae]
    torch.manual_seed(0)
    vae = getattr(diffusers, spec.cls)(**({} if device.type == "cuda" else spec.small)).eval()
    fused = cutlassfuse.fuse(copy.deepcopy(vae.decoder))
    fused_channels_last = cutlassfuse.fuse(copy.deepcopy(vae.decoder), channels_last=True)
    decoder = decoding(spec, vae, vae.decoder)
    dropped = sum(line.endswith("read by convolutions only)") for line in fused.replicate_pads)
    residuals = sum(" + " in line for line in fused.bias_adds)
    print(f"fuse: {len(fused.replaced)} chains fused, {len(fused.replicate_pads) - dropped} replicate pads replaced,"
          f" {dropped} dropped, {len(fused.bias_adds)} convolution biases on bias_add ({residuals} with a residual),"
          f" {len(fused.kernel_mode)} untraced module(s) under the kernel mode"
          + (f", {len(fused.library_modules)} library module(s) replaced" if fused.library_modules else ""))
    channels = vae.config.get("latent_channels", vae.config.get("z_dim"))
    latent = (1, channels, *map(int, (args.latent or spec.latent).split(",")))
    reference_model = copy.deepcopy(decoder).to(device, torch.float64)
    print(f"{'dtype':<10}{'decoder':<26}{'ms':>9}{'vs eager':>10}{'conv':>8}{'norm':>8}{'other':>8}"
          f"{'pads':>8}{'error':>11}")
    for dtype in (getattr(torch, name) for name in args.dtypes):
        def fused_decoding(result):
            return decoding(spec, vae, copy.deepcopy(result.model)).to(device, dtype)

        models = {"eager": copy.deepcopy(decoder).to(device, dtype),
                  "fuse": fused_decoding(fused),
                  "fuse, channels-last": fused_decoding(fused_channels_last)}
        if args.compile:
            models["torch.compile"] = torch.compile(copy.deepcopy(decoder).to(device, dtype))
            models["fuse, torch.compile"] = torch.compile(fused_decoding(fused))
        inputs = rotating_tensors(latent, dtype, device)
        calls = {name: Timed(model, inputs) for name, model in models.items()}
        if args.grad_mode:
            for name in ("eager", "fuse"):
                calls[f"{name}, grad mode"] = Timed(models[name], inputs, grad_mode=True)
        ms, refused = medians_over_rounds(calls, args.rounds, args.repeats)
        with torch.no_grad():
            reference = reference_model(inputs[0].double())
        for name in calls:
            model = calls[name].fn
            if name in refused:
                print(f"{str(dtype)[6:]:<10}{name:<26} refused: {refused[name]}")
                continue
            with torch.no_grad():
                error = (model(inputs[0]).double() - reference).abs().max().item()
            if calls[name].grad_mode:  # against eager in grad mode; the kernel split is no_grad's above
                print(f"{str(dtype)[6:]:<10}{name:<26}{ms[name]:>9.2f}{ms['eager, grad mode'] / ms[name]:>9.2f}x"
                      f"{'-':>8}{'-':>8}{'-':>8}{'-':>8}{error:>11.2e}")
                continue
            split = kernel_split_ms(model, inputs[:1])
            print(f"{str(dtype)[6:]:<10}{name:<26}{ms[name]:>9.2f}{ms['eager'] / ms[name]:>9.2f}x"
                  f"{split['conv']:>8.2f}{split['norm']:>8.2f}{split['other']:>8.2f}"
                  f"{pad_ms(model, inputs[0]):>8.2f}{error:>11.2e}")
        del models, calls
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
