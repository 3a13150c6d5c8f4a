"""Per-kernel times of two builds side by side, from `kernel_breakdown.py` logs.

    python benchmarks/compare_breakdowns.py --before before-*.log --after after-*.log [--tolerance 0.02]

Each log holds the output of `kernel_breakdown.py` for one or more shapes, one round of
the build; several rounds of each build (run alternately, so that clock and thermal drift
reach both alike) give each kernel's median. Prints every kernel of every run with the
ratio after/before and marks those outside the tolerance (differences within the logs'
0.1 us print resolution count as equal); the last line counts them.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import defaultdict

HEADER = re.compile(r"^(?P<case>\S+ (?:float16|bfloat16|float32)): ")  # "kb61 float16: fused_sm90: ..."
RUN = re.compile(r"^(?P<run>[^:]+): [\d.]+ us of kernels, (?P<launches>[\d.]+) launches per call")
KERNEL = re.compile(r"^\s+(?P<us>[\d.]+) us  (?P<name>.+)$")

Key = tuple[str, str, str]  # (case, run, kernel)
RESOLUTION_US = 0.1  # kernel_breakdown.py prints one decimal


def parse(path: str) -> dict[Key, float]:
    """Kernel times of one log: (case, run, kernel) -> us per call."""
    times: dict[Key, float] = {}
    case = run = ""
    with open(path) as log:
        for line in log:
            if (m := RUN.match(line)) and case:
                run = m["run"]
                times[(case, run, "launches per call")] = float(m["launches"])
            elif m := KERNEL.match(line):
                times[(case, run, m["name"].strip())] = float(m["us"])
            elif m := HEADER.match(line):
                case = m["case"]
    return times


def medians(paths: list[str]) -> dict[Key, float]:
    samples: dict[Key, list[float]] = defaultdict(list)
    for path in paths:
        for key, value in parse(path).items():
            samples[key].append(value)
    return {key: statistics.median(values) for key, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", nargs="+", required=True)
    parser.add_argument("--after", nargs="+", required=True)
    parser.add_argument("--tolerance", type=float, default=0.02)
    args = parser.parse_args()
    before, after = medians(args.before), medians(args.after)
    outside = 0
    print(f"{'case':24} {'run':52} {'kernel':42} {'before':>9} {'after':>9} {'ratio':>7}")
    for key in sorted(before.keys() | after.keys()):
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            outside += 1
            print(f"{key[0]:24} {key[1]:52} {key[2]:42} {b!s:>9} {a!s:>9}  only in one build  <<")
            continue
        ratio = a / b if b else float("inf") if a else 1.0
        mark = "  <<" if abs(ratio - 1.0) > args.tolerance and round(abs(a - b), 3) > RESOLUTION_US else ""
        outside += bool(mark)
        print(f"{key[0]:24} {key[1][:52]:52} {key[2][:42]:42} {b:9.1f} {a:9.1f} {ratio:7.3f}{mark}")
    print(f"{outside} of {len(before.keys() | after.keys())} entries outside +-{args.tolerance:.0%}")


if __name__ == "__main__":
    main()
