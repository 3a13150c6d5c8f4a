"""Switches for benchmarking and studying cutlassfuse's kernels, as ``torch.backends``
keeps PyTorch's: process-wide, read once at the start of each call, validated by the
extension (an unknown value raises ``ValueError`` and changes nothing).

Users need none of them: the defaults are what the op is built to run. They exist to
measure what a design choice is worth (the fallback against the fused path, one tile
configuration against another, a kernel feature on and off):

- ``fused_path`` (True): False sends every CUDA call to the fallback.
- ``dgrad_config`` ("auto"): pins the sm90 kernel configuration (``dgrad_configs()``
  lists them); "auto" is the heuristic.
- ``skip_border_taps`` (True): False makes the ping-pong kernel run the K blocks of
  depth taps that reach none of a tile's pixels too.
- ``drawn_tile_schedule`` (True): False makes the ping-pong kernel's CTAs walk their
  tiles statically instead of drawing them from a counter.
- ``phase_streams`` (1): spreads a strided call's sub-pixel phases over 1 to 8 streams,
  forked from and joined back into the current stream.
- ``conv_gradients`` ("auto"): which kernels compute the backward's convolution
  gradients in float16/bfloat16 on sm_90. "auto": this project's CUTLASS kernels where
  the measured rule prefers them (strided layers), ATen's ``convolution_backward``
  (cuDNN) elsewhere; "aten": ATen everywhere; "cutlass": the CUTLASS kernels wherever
  they take the layer.
- ``resident_norm`` (True): False makes the standalone norm (``group_norm_activation``)
  and the fallback blocks' norm run its statistics, finalize and normalize as three
  launches where one launch holding the tensor on chip would take it.

``cutlassfuse.explain(...)`` reports what a call runs under the current flags.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_NAMES = ("fused_path", "dgrad_config", "skip_border_taps", "drawn_tile_schedule", "phase_streams",
          "conv_gradients", "resident_norm")


def get_flags() -> dict[str, bool | str | int]:
    """The current flags, by name."""
    return dict(zip(_NAMES, torch.ops.cutlassfuse.backend_flags(), strict=True))


def set_flags(*, fused_path: bool | None = None, dgrad_config: str | None = None,
              skip_border_taps: bool | None = None, drawn_tile_schedule: bool | None = None,
              phase_streams: int | None = None, conv_gradients: str | None = None,
              resident_norm: bool | None = None) -> dict[str, bool | str | int]:
    """Sets the flags given (None leaves one as it is) in one step; returns the previous
    flags."""
    previous = torch.ops.cutlassfuse.set_backend_flags(fused_path, dgrad_config, skip_border_taps,
                                                       drawn_tile_schedule, phase_streams, conv_gradients,
                                                       resident_norm)
    return dict(zip(_NAMES, previous, strict=True))


@contextlib.contextmanager
def flags(*, fused_path: bool | None = None, dgrad_config: str | None = None,
          skip_border_taps: bool | None = None, drawn_tile_schedule: bool | None = None,
          phase_streams: int | None = None, conv_gradients: str | None = None,
          resident_norm: bool | None = None) -> Iterator[None]:
    """``set_flags(...)`` inside the ``with`` block; every flag as before after it."""
    previous = set_flags(fused_path=fused_path, dgrad_config=dgrad_config, skip_border_taps=skip_border_taps,
                         drawn_tile_schedule=drawn_tile_schedule, phase_streams=phase_streams,
                         conv_gradients=conv_gradients, resident_norm=resident_norm)
    try:
        yield
    finally:
        set_flags(**previous)


def dgrad_configs() -> tuple[str, ...]:
    """The sm90 kernel configurations ``dgrad_config`` accepts, besides "auto"."""
    return tuple(torch.ops.cutlassfuse.dgrad_configs())
