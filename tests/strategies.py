"""Hypothesis strategies over the whole ConvTranspose3d -> ReLU -> GroupNorm parameter
space, shared by the CPU property test and the GPU one. A configuration is a dict of
cutlassfuse.testing.make_inputs's shape keywords: make_inputs(**config, dtype=...)."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from cutlassfuse.ops import transposed_conv_output_size


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def configurations(draw, max_channels: int = 16, max_size: int = 5, allow_empty_batch: bool = True,
                   fused_friendly: bool = False, conv_groups: bool = True) -> dict:
    """fused_friendly: channels in multiples of 8 and one conv group, the shapes the
    sm90 fused path takes (else anything valid, mostly the reference path).
    conv_groups=False keeps one conv group."""
    groups = draw(st.sampled_from([1, 1, 2, 3])) if conv_groups and not fused_friendly else 1
    step = 8 * groups if fused_friendly else groups
    in_channels = step * draw(st.integers(1, max(1, max_channels // step)))
    out_channels = step * draw(st.integers(1, max(1, max_channels // step)))
    triple = lambda s: st.tuples(s, s, s)  # noqa: E731
    kernel = draw(triple(st.integers(1, 4)))
    stride = draw(triple(st.integers(1, 3)))
    dilation = draw(triple(st.integers(1, 2)))
    padding = draw(triple(st.integers(0, 2)))
    output_padding = tuple(draw(st.integers(0, max(s, d) - 1)) for s, d in zip(stride, dilation, strict=True))
    size = draw(triple(st.integers(1, max_size)))
    assume(min(transposed_conv_output_size(size, kernel, stride, padding, output_padding, dilation)) >= 1)
    return dict(
        batch=draw(st.integers(0 if allow_empty_batch else 1, 3)),
        in_channels=in_channels, out_channels=out_channels, size=size, kernel=kernel, stride=stride,
        padding=padding, output_padding=output_padding, dilation=dilation, groups=groups,
        num_groups=draw(st.sampled_from(_divisors(out_channels))),
        bias=draw(st.booleans()), affine=draw(st.booleans()), channels_last=draw(st.booleans()),
        eps=draw(st.sampled_from([1e-5, 1e-3, 0.1])),
    )

