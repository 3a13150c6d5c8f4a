"""diffusers' HunyuanVideo autoencoder's decoder through `cutlassfuse.fuse`: eager against
the fused decoder (the activations in the input's layout, as fuse() chooses for a model it
traces in parts, and channels-last), with --compile also torch.compile of the decoder and
of the fused decoder, under torch.no_grad() with random weights at the model's own
configuration; with --grad-mode also eager and the fused decoder called in grad mode, as
scripts call a model without torch.no_grad() (parameters requiring grad, no backward). Per
dtype: the median ms over alternating rounds (each a median of --repeats calls on fresh
latents), the kernel time per call split into convolutions, norms and the rest
(torch.profiler, under torch.no_grad()), of it the replicate pads' kernels (ATen's
replication_pad3d, or cutlassfuse's), and each decoder's max abs error against a float64
copy of it on one latent. Needs diffusers.

    python benchmarks/video_vae.py [--dtypes float16,bfloat16] [--latent 5,32,32] [--compile] [--grad-mode]
    python benchmarks/video_vae.py --device cpu --dtypes float32 --latent 2,8,8   # checks it without a GPU
"""

from __future__ import annotations

import argparse
import copy

import torch

import cutlassfuse
from cutlassfuse.__main__ import DTYPES, comma_list, positive_int
from cutlassfuse.bench import rotating_tensors
from cutlassfuse.block_bench import Timed, medians_over_rounds
from cutlassfuse.network_bench import kernel_split_ms

try:
    from diffusers import AutoencoderKLHunyuanVideo
except ImportError as error:
    raise SystemExit(f"video_vae.py needs diffusers (pip install diffusers): {error}") from error


# On the CPU: the same architecture with fewer channels and one resnet per block.
SMALL = dict(block_out_channels=(32, 32, 64, 64), norm_num_groups=8, layers_per_block=1)


def pad_ms(model: torch.nn.Module, x: torch.Tensor) -> float:
    """The time per call under torch.no_grad() of the replicate pads: kernels (ATen's and
    cutlassfuse's NCDHW rows kernel say replication_pad, cutlassfuse's gathers PadGrid), or
    on the CPU ops, whose names say replication_pad."""
    def kind(name: str) -> str:
        return "pad" if "replication_pad" in name or "PadGrid" in name else "rest"
    return kernel_split_ms(model, [x], kind).get("pad", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", default="float16,bfloat16", type=comma_list(DTYPES))
    parser.add_argument("--latent", default="5,32,32", help="the latent's frames,height,width (16 channels)")
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
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo(**({} if device.type == "cuda" else SMALL))
    decoder = vae.decoder.eval()
    fused = cutlassfuse.fuse(copy.deepcopy(decoder))
    fused_channels_last = cutlassfuse.fuse(copy.deepcopy(decoder), channels_last=True)
    dropped = sum(line.endswith("read by convolutions only)") for line in fused.replicate_pads)
    residuals = sum(" + " in line for line in fused.bias_adds)
    print(f"fuse: {len(fused.replaced)} chains fused, {len(fused.replicate_pads) - dropped} replicate pads replaced,"
          f" {dropped} dropped, {len(fused.bias_adds)} convolution biases on bias_add ({residuals} with a residual),"
          f" {len(fused.kernel_mode)} untraced module(s) under the kernel mode")
    latent = (1, vae.config.latent_channels, *map(int, args.latent.split(",")))
    reference_model = copy.deepcopy(decoder).to(device, torch.float64)
    print(f"{'dtype':<10}{'decoder':<26}{'ms':>9}{'vs eager':>10}{'conv':>8}{'norm':>8}{'other':>8}"
          f"{'pads':>8}{'error':>11}")
    for dtype in (getattr(torch, name) for name in args.dtypes):
        models = {"eager": copy.deepcopy(decoder).to(device, dtype),
                  "fuse": copy.deepcopy(fused.model).to(device, dtype),
                  "fuse, channels-last": copy.deepcopy(fused_channels_last.model).to(device, dtype)}
        if args.compile:
            models["torch.compile"] = torch.compile(copy.deepcopy(decoder).to(device, dtype))
            models["fuse, torch.compile"] = torch.compile(copy.deepcopy(fused.model).to(device, dtype))
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
