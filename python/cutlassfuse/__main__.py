"""Command line: `python -m cutlassfuse {demo,info,bench,profile,data-parallel}`."""

from __future__ import annotations

import argparse
import json
import os
import sys


def comma_list(choices: tuple[str, ...]):
    """An argparse type: comma-separated values, each one of `choices`."""

    def parse(text: str) -> list[str]:
        values = text.split(",")
        unknown = [v for v in values if v not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(choices)}")
        return values

    return parse


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


DTYPES = ("float16", "bfloat16", "float32")
DATA_PARALLEL_MODES = ("DDP", "FSDP2")
MEMORY_FORMATS = ("ncdhw", "channels_last")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="KernelBench level2/61 through cutlassfuse and PyTorch: errors, timings")
    demo.add_argument("--cpu", action="store_true", help="run the reduced CPU demo even when a GPU is present")
    commands.add_parser("info", help="build and device information, as JSON")
    bench = commands.add_parser("bench", help="the fused op against eager, torch.compile, cuDNN and CUTLASS alone")
    bench.add_argument("--shapes", default="kb61,kb61_v0,unet_k2s2,gan_k4s2p1,vid_k3s2p1op1",
                       help="names, or N,Cin,Cout,D,H,W,kernel,stride,padding,output_padding,groups; ';'-separated "
                            "when custom")
    bench.add_argument("--dtypes", default="float16,bfloat16", type=comma_list(DTYPES),
                       help="comma-separated: " + ", ".join(DTYPES))
    bench.add_argument("--memory-formats", default="ncdhw", type=comma_list(MEMORY_FORMATS),
                       help="ncdhw, channels_last, or both comma-separated")
    bench.add_argument("--no-compile", action="store_true", help="leave out torch.compile (slow to compile)")
    bench.add_argument("--repeats", type=positive_int,
                       help="timed calls per implementation (with --blocks or --networks: per round); default 50, "
                            "10 with --networks")
    bench.add_argument("--rounds", type=positive_int, default=5,
                       help="with --blocks or --networks: alternating rounds per case")
    bench.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                       help="cuda (default), or cpu to check the command where there is no GPU")
    bench.add_argument("--tiny", action="store_true",
                       help="each shape at one sample, a quarter of the channels and an eighth of the extent "
                            "(--networks: each network with a few channels on one small sample)")
    bench.add_argument("--csv")
    bench.add_argument("--json")
    bench.add_argument("--plot", help="PNG of the speedups")
    bench.add_argument("--blocks", help="instead of the op's shapes, the block family on real networks' blocks: "
                                        "all, or comma-separated names (basicunet_conv, dynunet_conv, unet_down, "
                                        "unet_up, segres_conv, upsampler_conv, segres_norm, kb61)")
    bench.add_argument("--networks", nargs="?", const="all",
                       help="instead of the op's shapes, whole MONAI networks through cutlassfuse.fuse (needs MONAI): "
                            "all (also --networks alone), or comma-separated names (unet, basicunet, dynunet, "
                            "segresnet)")
    bench.add_argument("--train", action="store_true",
                       help="with --blocks or --networks: also time a training step (--networks: and compare the "
                            "parameter gradients' errors against float64)")
    profile = commands.add_parser("profile", help="Nsight Compute table of one call's kernels")
    profile.add_argument("--shape", default="kb61")
    profile.add_argument("--dtype", default="float16", choices=DTYPES)
    profile.add_argument("--memory-format", default="ncdhw", choices=["ncdhw", "channels_last"])
    profile.add_argument("--csv", help="keep ncu's full CSV here")
    data_parallel = commands.add_parser(
        "data-parallel", help="under torchrun: DistributedDataParallel and FSDP2 training of fused blocks against one "
                              "process, step by step (torchrun --nproc-per-node 2 -m cutlassfuse data-parallel)")
    data_parallel.add_argument("--modes", default="DDP,FSDP2", type=comma_list(DATA_PARALLEL_MODES),
                               help="comma-separated: " + ", ".join(DATA_PARALLEL_MODES))
    data_parallel.add_argument("--dtypes", default="float32,float16,bfloat16", type=comma_list(DTYPES),
                               help="comma-separated: " + ", ".join(DTYPES) + " (16-bit: under torch.autocast)")
    data_parallel.add_argument("--steps", type=positive_int, default=4, help="SGD steps compared")
    data_parallel.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                               help="cuda (default): NCCL, one GPU per process; cpu: gloo")
    args = parser.parse_args(argv)
    if args.command == "bench" and args.blocks and args.networks:
        parser.error("bench takes --blocks or --networks, not both")
    if args.command == "bench" and args.repeats is None:
        args.repeats = 10 if args.networks else 50
    if args.command == "data-parallel" and "LOCAL_RANK" not in os.environ:
        parser.error("data-parallel runs in each process of torchrun: "
                     "torchrun --nproc-per-node 2 -m cutlassfuse data-parallel")

    import torch

    import cutlassfuse

    if args.command == "info":
        print(json.dumps(cutlassfuse.info(), indent=2))
    elif args.command == "demo":
        from .demo import run_demo

        run_demo(torch.device("cpu") if args.cpu else None)
    elif args.command == "bench" and args.blocks:
        from .block_bench import run_block_bench

        run_block_bench(args.blocks.split(","),
                        [getattr(torch, d) for d in args.dtypes], args.memory_formats,
                        with_compile=not args.no_compile, train=args.train, repeats=args.repeats,
                        rounds=args.rounds, csv_path=args.csv, device=args.device, tiny=args.tiny)
    elif args.command == "bench" and args.networks:
        from .network_bench import run_network_bench

        run_network_bench(args.networks.split(","), [getattr(torch, d) for d in args.dtypes], args.memory_formats,
                          with_compile=not args.no_compile, train=args.train, repeats=args.repeats,
                          rounds=args.rounds, csv_path=args.csv, device=args.device, tiny=args.tiny)
    elif args.command == "bench":
        from .bench import parse_shape, run_bench

        separator = ";" if ";" in args.shapes or args.shapes.count(",") >= 10 else ","
        run_bench([parse_shape(s) for s in args.shapes.split(separator)],
                  [getattr(torch, d) for d in args.dtypes],
                  [f == "channels_last" for f in args.memory_formats],
                  with_compile=not args.no_compile, repeats=args.repeats, csv_path=args.csv, json_path=args.json,
                  plot_path=args.plot, device=args.device, tiny=args.tiny)
    elif args.command == "profile":
        from .profiling import run_profile

        print(run_profile(args.shape, args.dtype, args.memory_format, args.csv))
    elif args.command == "data-parallel":
        from .data_parallel import run_data_parallel_check

        return run_data_parallel_check(args.modes, [getattr(torch, d) for d in args.dtypes], args.steps, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
