"""Command line: `python -m cutlassfuse {demo,info}`."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cutlassfuse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="KernelBench level2/61 through cutlassfuse and PyTorch: errors, timings")
    demo.add_argument("--cpu", action="store_true", help="run the reduced CPU demo even when a GPU is present")
    commands.add_parser("info", help="build and device information, as JSON")
    args = parser.parse_args(argv)

    import torch

    import cutlassfuse

    if args.command == "info":
        print(json.dumps(cutlassfuse.info(), indent=2))
    elif args.command == "demo":
        from .demo import run_demo

        run_demo(torch.device("cpu") if args.cpu else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
