"""The block family on the blocks of real 3D networks (cutlassfuse.block_bench, which
`python -m cutlassfuse bench --blocks` runs too): each block as the torch.nn modules a
network holds (eager, and torch.compile of them) against the cutlassfuse module built from
them, beside cuDNN's convolution alone plus one copy of the output.

    python benchmarks/blocks.py [--blocks basicunet_conv,kb61] [--dtypes float16,bfloat16] [--no-compile] [--train]
    python benchmarks/blocks.py --device cpu --tiny --dtypes float32 --no-compile   # checks the script without a GPU
"""

from __future__ import annotations

import argparse

import torch

from cutlassfuse.__main__ import DTYPES, MEMORY_FORMATS, comma_list, positive_int
from cutlassfuse.block_bench import BLOCK_NAMES, run_block_bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", default=",".join(BLOCK_NAMES), type=comma_list(BLOCK_NAMES),
                        help="comma-separated: " + ", ".join(BLOCK_NAMES))
    parser.add_argument("--dtypes", default="float16", type=comma_list(DTYPES), help="comma-separated: "
                        + ", ".join(DTYPES))
    parser.add_argument("--memory-formats", default="ncdhw,channels_last", type=comma_list(MEMORY_FORMATS),
                        help="the input's: ncdhw, channels_last, or both comma-separated")
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (slow to compile)")
    parser.add_argument("--train", action="store_true", help="also time a training step of eager and cutlassfuse")
    parser.add_argument("--repeats", type=positive_int, default=20, help="timed calls per implementation and round")
    parser.add_argument("--rounds", type=positive_int, default=5, help="alternating rounds per case")
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="each block at one sample and a fraction of its size")
    args = parser.parse_args()
    run_block_bench(args.blocks, [getattr(torch, name) for name in args.dtypes], args.memory_formats,
                    with_compile=not args.no_compile, train=args.train, repeats=args.repeats, rounds=args.rounds,
                    csv_path=args.csv, device=args.device, tiny=args.tiny)


if __name__ == "__main__":
    main()
