"""torch.ops.cutlassfuse.replication_pad3d against ATen's F.pad(x, pad, mode="replicate")
and a copy of the output (clone, the bound of any pad), per shape, layout and dtype: the
median over alternating rounds of each round's median ms (fresh inputs rotating past L2),
the bandwidth of the pad's read and write, and whether its output equals ATen's bit for
bit. The default shapes are the HunyuanVideo decoder's largest causal-pad inputs.

    python benchmarks/replication_pad.py [--shapes 1x128x17x256x256,...] [--dtypes float16,float32]
    python benchmarks/replication_pad.py --device cpu --shapes 1x3x2x5x7   # checks it without a GPU
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import cutlassfuse  # noqa: F401  (registers torch.ops.cutlassfuse)
from cutlassfuse.__main__ import DTYPES, comma_list, positive_int
from cutlassfuse.bench import rotating_tensors
from cutlassfuse.block_bench import Timed, medians_over_rounds

PAD = torch.ops.cutlassfuse.replication_pad3d.default
CAUSAL = [1, 1, 1, 1, 2, 0]  # HunyuanVideoCausalConv3d's pad for a 3x3x3 kernel
LAYOUTS = {"ncdhw": torch.contiguous_format, "channels_last": torch.channels_last_3d}


def shape_list(text: str) -> list[tuple[int, ...]]:
    shapes = [tuple(int(n) for n in item.split("x")) for item in text.split(",")]
    if any(len(shape) != 5 or min(shape) < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"shapes are NxCxDxHxW with positive sizes, not {text!r}")
    return shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=shape_list, default="1x128x17x256x256,1x512x9x128x128,1x512x5x32x32")
    parser.add_argument("--dtypes", default="float16,float32", type=comma_list(DTYPES))
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--rounds", type=positive_int, default=5)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = parser.parse_args()

    device = torch.device(args.device)
    print(f"{'shape':<20}{'dtype':<9}{'layout':<15}{'pad ms':>9}{'ATen ms':>9}{'copy ms':>9}"
          f"{'vs ATen':>9}{'vs copy':>9}{'GB/s':>8}  equal")
    for shape in args.shapes:
        for dtype in (getattr(torch, name) for name in args.dtypes):
            for layout, memory_format in LAYOUTS.items():
                inputs = rotating_tensors(shape, dtype, device, memory_format)
                expected = F.pad(inputs[0], CAUSAL, mode="replicate")
                equal = torch.equal(PAD(inputs[0], CAUSAL), expected)
                outputs = rotating_tensors(tuple(expected.shape), dtype, device, memory_format)
                calls = {"pad": Timed(lambda x: PAD(x, CAUSAL), inputs),
                         "aten": Timed(lambda x: F.pad(x, CAUSAL, mode="replicate"), inputs),
                         "copy": Timed(torch.clone, outputs)}
                ms, _ = medians_over_rounds(calls, args.rounds, args.repeats)
                moved = (inputs[0].numel() + expected.numel()) * expected.element_size()
                print(f"{'x'.join(map(str, shape)):<20}{str(dtype)[6:]:<9}{layout:<15}{ms['pad']:>9.3f}"
                      f"{ms['aten']:>9.3f}{ms['copy']:>9.3f}{ms['aten'] / ms['pad']:>8.2f}x"
                      f"{ms['pad'] / ms['copy']:>8.2f}x{moved / ms['pad'] / 1e6:>8.0f}  {equal}")
                del inputs, outputs, expected
                if device.type == "cuda":
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
