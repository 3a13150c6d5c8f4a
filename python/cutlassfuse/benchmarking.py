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


def loop_ms(fn: Callable[[], object], *, cuda: bool, warmup: int = 3, repeats: int = 10) -> float:
    """Milliseconds per call of `repeats` back-to-back calls of `fn` between two
    synchronizations, read on the host clock: the steady-state time of a loop such as a
    training loop, in which the host issues the next call while the device runs this
    one, so that a call costs the larger of its host time and its device time. (Events
    around each call would count the device's idle wait for the host inside the call, and
    not the host time outside its first and last kernels.)"""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / repeats


def median_ms(fn: Callable[[], object], *, cuda: bool, warmup: int = 10, repeats: int = 50) -> float:
    """Median of `times_ms`."""
    return statistics.median(times_ms(fn, cuda=cuda, warmup=warmup, repeats=repeats))


def print_fused_against_eager(eager: Callable[[torch.Tensor], torch.Tensor],
                              fused: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, what: str) -> None:
    """The examples' last lines, under torch.no_grad(): the largest difference between
    the two models' outputs on `x` (``what`` describes them), then each model's median
    time (a few calls on the CPU)."""
    cuda = x.is_cuda
    with torch.no_grad():
        a, b = eager(x), fused(x)
        print(f"max |fused - eager| = {(a.float() - b.float()).abs().max().item():.3e}, max |eager| = "
              f"{a.float().abs().max().item():.3e} (output {tuple(b.shape)}, {what})")
        for name, model in (("eager", eager), ("fused", fused)):
            ms = median_ms(lambda model=model: model(x), cuda=cuda, warmup=3 if cuda else 1, repeats=20 if cuda else 2)
            print(f"{name}: {ms:.3f} ms")
