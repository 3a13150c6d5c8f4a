"""The sub-pixel phase plan that the CUDA path launches for strided deconvolution
(cpp/include/cutlassfuse/plan/subpixel.h), executed here with ATen exactly as the CUTLASS
dgrad reads it: every phase takes views (offset + strides) of the packed NDHWC input,
the packed [Cin, T, R, S, Cout] filter and the NDHWC output, and computes
y[q] = sum_t x[q + lower - t * dilation] w[t] with the extents CUTLASS derives from
the asymmetric padding. Reassembled, the phases plus ReLU(bias) at the unreached
pixels must equal F.conv_transpose3d, every output pixel written exactly once."""

from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from strategies import configurations  # tests/strategies.py

import cutlassfuse  # noqa: F401  (loads torch.ops.cutlassfuse)
from cutlassfuse.ops import transposed_conv_output_size
from cutlassfuse.testing import make_inputs

PHASE_FIELDS = 33  # three views of 8 values, then lower padding, upper padding, dilation


class View(NamedTuple):
    offset: int
    extent: tuple
    stride: tuple  # (outer, d, h, w); channels contiguous

    def of(self, flat: torch.Tensor, outer: int, channels: int) -> torch.Tensor:
        return flat.as_strided((outer, *self.extent, channels), (*self.stride, 1), self.offset)


class Phase(NamedTuple):
    input: View
    filter: View
    output: View
    lower: tuple
    upper: tuple
    dilation: tuple


def plan(x_shape, w_shape, stride, padding, output_padding, dilation) -> tuple[int, list[Phase]]:
    flat = torch.ops.cutlassfuse.subpixel_plan(list(x_shape[2:]), list(w_shape[2:]), list(stride), list(padding),
                                               list(output_padding), list(dilation), x_shape[1], w_shape[1])
    unreached, rest = flat[0], flat[1:]
    assert len(rest) % PHASE_FIELDS == 0
    phases = []
    for i in range(0, len(rest), PHASE_FIELDS):
        f = rest[i:i + PHASE_FIELDS]
        views = [View(f[j], tuple(f[j + 1:j + 4]), tuple(f[j + 4:j + 8])) for j in (0, 8, 16)]
        phases.append(Phase(*views, tuple(f[24:27]), tuple(f[27:30]), tuple(f[30:33])))
    return unreached, phases


def run_phase(phase: Phase, x_flat, filter_flat, y_flat, batch, cin, cout):
    assert min(phase.lower) >= 0 and min(phase.upper) >= 0, "CUTLASS takes non-negative padding only"
    taps = phase.filter.extent
    for i in range(3):  # CUTLASS derives the input extent from the output's: they must agree
        reach = phase.dilation[i] * (taps[i] - 1)
        assert phase.input.extent[i] == phase.output.extent[i] + phase.lower[i] + phase.upper[i] - reach
    x = phase.input.of(x_flat, batch, cin).permute(0, 4, 1, 2, 3)
    w = phase.filter.of(filter_flat, cin, cout).permute(0, 4, 1, 2, 3)
    full = F.conv_transpose3d(x, w, dilation=phase.dilation)  # full[i + t * d] += x[i] w[t]
    q = phase.output.extent
    y = full[:, :, phase.lower[0]:phase.lower[0] + q[0], phase.lower[1]:phase.lower[1] + q[1],
             phase.lower[2]:phase.lower[2] + q[2]]
    assert tuple(y.shape[2:]) == q
    phase.output.of(y_flat, batch, cout).copy_(y.permute(0, 2, 3, 4, 1))


def reached_by_rule(o: int, size: int, kernel: int, stride: int, padding: int, dilation: int) -> bool:
    """Output o receives a tap: some t puts input (o + padding - t * dilation) / stride there."""
    return any((o + padding - t * dilation) >= 0 and (o + padding - t * dilation) % stride == 0
               and (o + padding - t * dilation) // stride < size for t in range(kernel))


def deconvolve_by_phases(x, w, bias, stride, padding, output_padding, dilation):
    batch, cin = x.shape[:2]
    cout = w.shape[1]
    out_size = transposed_conv_output_size(x.shape[2:], w.shape[2:], stride, padding, output_padding, dilation)
    unreached, phases = plan(x.shape, w.shape, stride, padding, output_padding, dilation)
    x_flat = x.permute(0, 2, 3, 4, 1).contiguous().flatten()
    filter_flat = w.permute(0, 2, 3, 4, 1).contiguous().flatten()
    y_flat = torch.full((batch * cout * out_size[0] * out_size[1] * out_size[2],), float("nan"), dtype=x.dtype)
    writes = torch.zeros_like(y_flat)
    for phase in phases:
        run_phase(phase, x_flat, filter_flat, y_flat, batch, cin, cout)
        phase.output.of(writes, batch, cout).add_(1)
    y = y_flat.view(batch, *out_size, cout).permute(0, 4, 1, 2, 3)
    counts = writes.view(batch, *out_size, cout)[..., 0]
    assert counts.max() <= 1, "an output pixel belongs to two phases"
    assert int((counts[0] == 0).sum()) == unreached, "the plan miscounts the pixels no tap reaches"
    # The rule fill_unreached_kernel applies (cpp/src/unreached_fill.cu) marks every pixel
    # no phase writes (it may mark more: a phase also computes the holes between the
    # outputs its taps reach, where it writes the same ReLU(bias) after the fill).
    dims = zip(out_size, x.shape[2:], w.shape[2:], stride, padding, dilation, strict=True)
    reached = [torch.tensor([reached_by_rule(o, n, k, s, p, d) for o in range(extent)])
               for extent, n, k, s, p, d in dims]
    by_rule = reached[0].view(-1, 1, 1) & reached[1].view(1, -1, 1) & reached[2].view(1, 1, -1)
    assert not (by_rule & (counts[0] == 0)).any(), "a pixel no phase writes escapes the fill"
    y = torch.where((counts == 0).unsqueeze(1), torch.zeros((), dtype=x.dtype), y)
    return y if bias is None else y + bias.view(1, -1, 1, 1, 1)


@pytest.mark.parametrize("stride,kernel,padding,output_padding,dilation", [
    ((1, 1, 1), (3, 3, 3), (0, 0, 0), (0, 0, 0), (1, 1, 1)),   # KernelBench 61: one phase, the whole kernel
    ((1, 1, 1), (2, 2, 3), (2, 0, 1), (0, 1, 0), (1, 2, 1)),   # stride 1, padding beyond the kernel, op > padding
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1)),   # kernel == stride: one tap per phase (a GEMM)
    ((2, 2, 2), (4, 4, 4), (1, 1, 1), (0, 0, 0), (1, 1, 1)),   # GAN generator
    ((2, 2, 2), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),   # video decoder, output_padding
    ((3, 2, 1), (2, 3, 4), (0, 1, 2), (2, 1, 0), (1, 1, 1)),   # kernel < stride: phases without taps
    ((2, 3, 2), (3, 3, 2), (1, 0, 1), (1, 2, 0), (2, 1, 3)),   # dilation sharing factors with stride
    ((2, 2, 3), (1, 3, 2), (0, 2, 1), (1, 0, 2), (3, 3, 1)),   # outputs before the first tap reaches
])
def test_phases_reassemble_conv_transpose3d(stride, kernel, padding, output_padding, dilation):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, 4, *kernel, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    expected = F.conv_transpose3d(x, w, b, stride, padding, output_padding, 1, dilation)
    got = deconvolve_by_phases(x, w, b, stride, padding, output_padding, dilation)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(configurations(max_channels=4, allow_empty_batch=False, conv_groups=False))
def test_phases_reassemble_any_configuration(config):
    a = make_inputs(**config, dtype=torch.float64, seed=2)
    expected = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                                  a["output_padding"], 1, a["dilation"])
    got = deconvolve_by_phases(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                               a["dilation"])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride", [(2, 2, 2), (3, 2, 1), (1, 1, 4)])
def test_kernel_equal_to_stride_is_one_gemm_in_space_to_depth_order(stride):
    """The pixel-shuffle GEMM of the CUDA path (plan/subpixel.h): with kernel == stride and no
    padding, [input pixels, Cin] x the packed filter [Cin, T*R*S*Cout] gives, per input
    pixel, its block of output pixels in (t, r, s) order; depth-to-space of that is
    F.conv_transpose3d."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 3, 4, 2, generator=g, dtype=torch.float64)
    w = torch.randn(5, 6, *stride, generator=g, dtype=torch.float64)
    batch, cin, depth, height, width = x.shape
    cout = w.shape[1]
    packed = w.permute(0, 2, 3, 4, 1).reshape(cin, -1)                  # [Cin, (t, r, s, Cout)]
    gemm = x.permute(0, 2, 3, 4, 1).reshape(-1, cin) @ packed           # [(n, z, p, q), (t, r, s, Cout)]
    blocks = gemm.view(batch, depth, height, width, *stride, cout)      # space-to-depth order
    out_size = [e * s for e, s in zip(x.shape[2:], stride, strict=True)]
    y = blocks.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(batch, cout, *out_size)
    torch.testing.assert_close(y, F.conv_transpose3d(x, w, stride=stride), rtol=1e-12, atol=1e-12)
    # The normalize pass's reading order (source_row in cpp/src/norm/group_norm.cu): output
    # pixel p of a sample is row source_row(p) of the sample's GEMM output.
    rows = torch.tensor([source_row(p, stride, out_size) for p in range(out_size[0] * out_size[1] * out_size[2])])
    per_sample = gemm.view(batch, -1, cout)                             # [n, rows, Cout]
    torch.testing.assert_close(per_sample[:, rows].permute(0, 2, 1).reshape(y.shape), y, rtol=0, atol=0)


def source_row(pixel: int, block, out_size) -> int:
    ho, wo = out_size[1], out_size[2]
    ow, oh, od = pixel % wo, pixel // wo % ho, pixel // (wo * ho)
    input_pixel = ((od // block[0]) * (ho // block[1]) + oh // block[1]) * (wo // block[2]) + ow // block[2]
    position = ((od % block[0]) * block[1] + oh % block[1]) * block[2] + ow % block[2]
    return input_pixel * block[0] * block[1] * block[2] + position
