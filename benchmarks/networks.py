"""Whole MONAI networks through `cutlassfuse.fuse` (cutlassfuse.network_bench, which
`python -m cutlassfuse bench --networks` runs too): MONAI's UNet, BasicUNet, DynUNet and
SegResNet against the model fuse() makes of each, with and without torch.compile, their
errors against the float64 network, and with --train a training step and the parameter
gradients' errors against the float64 network's. Needs MONAI.

    python benchmarks/networks.py [--networks unet,basicunet] [--dtypes float16,bfloat16] [--memory-formats ncdhw]
                                  [--no-compile] [--train] [--repeats 10] [--rounds 5] [--csv networks.csv]
    python benchmarks/networks.py --device cpu --tiny --dtypes float32 --no-compile   # checks the script without a GPU
"""

from __future__ import annotations

import argparse

import torch

from cutlassfuse.__main__ import DTYPES, MEMORY_FORMATS, comma_list, positive_int
from cutlassfuse.network_bench import NETWORK_NAMES, run_network_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--networks", default=",".join(NETWORK_NAMES), type=comma_list(NETWORK_NAMES),
                        help="comma-separated: " + ", ".join(NETWORK_NAMES))
    parser.add_argument("--dtypes", default="float16", type=comma_list(DTYPES), help="comma-separated: "
                        + ", ".join(DTYPES))
    parser.add_argument("--memory-formats", default="ncdhw,channels_last", type=comma_list(MEMORY_FORMATS),
                        help="the model's and input's: ncdhw, channels_last, or both comma-separated")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (slow to compile)")
    parser.add_argument("--train", action="store_true",
                        help="also time a training step of eager and the fused model and compare their gradients")
    parser.add_argument("--repeats", type=positive_int, default=10, help="timed calls per implementation and round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating rounds per case")
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="each network with a few channels on one small sample")
    args = parser.parse_args()
    run_network_bench(args.networks, [getattr(torch, name) for name in args.dtypes], args.memory_formats,
                      with_compile=not args.no_compile, train=args.train, repeats=args.repeats, rounds=args.rounds,
                      csv_path=args.csv, device=args.device, tiny=args.tiny)


if __name__ == "__main__":
    main()
