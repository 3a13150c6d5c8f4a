"""Timing device work the way it should be timed: warm-up, CUDA events, medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def times_ms(fn: Callable[[], object], *, cuda: bool, warmup: int = 10, repeats: int = 50) -> list[float]:
    """Milliseconds of each of `repeats` timed calls of `fn` after `warmup` untimed ones.

    CUDA work is timed with events around each call on the current stream; CPU work
    with perf_counter.
    """
    for _ in range(warmup):
        fn()
    if not cuda:
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e3)
        return samples
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    torch.cuda.synchronize()
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def median_ms(fn: Callable[[], object], *, cuda: bool, warmup: int = 10, repeats: int = 50) -> float:
    """Median of `times_ms`."""
    return statistics.median(times_ms(fn, cuda=cuda, warmup=warmup, repeats=repeats))
