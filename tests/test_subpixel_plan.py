"""The sub-pixel phase decomposition planned for strided deconvolution
(docs/architecture.md, "Next: strided deconvolution"), checked on the CPU before any
kernel implements it: every phase is a unit-stride ConvTranspose3d of the input with a
sub-kernel (taps t with t*d = phi mod s, dilation d / gcd(d, s)), written to the
strided view y[phi - p :: s], shifted by the phase's first tap; phases without taps
receive nothing but the bias. Reassembled, the phases equal F.conv_transpose3d."""

import itertools
import math
from typing import NamedTuple

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from strategies import configurations, make_inputs  # tests/strategies.py


class Phase(NamedTuple):
    taps: list[int]     # kernel taps t with t * dilation = phi (mod stride)
    dilation: int       # of the sub-kernel: dilation / gcd(dilation, stride)
    first_output: int   # o0 = stride * q_first + phi - padding, the phase's first output index
    count: int          # outputs o0, o0 + stride, ... inside the output
    offset: int         # phase output k reads the sub-problem's full output at k + offset


def phase_plan_1d(size, kernel, stride, padding, output_padding, dilation) -> tuple[int, list[Phase]]:
    out = (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1
    phases = []
    for phi in range(stride):
        taps = [t for t in range(kernel) if (t * dilation) % stride == phi]
        q_first = -((phi - padding) // stride)  # ceil((padding - phi) / stride)
        first_output = stride * q_first + phi - padding
        count = len(range(first_output, out, stride))
        shift = (taps[0] * dilation - phi) // stride if taps else 0  # input offset of the first tap
        phases.append(Phase(taps, dilation // math.gcd(dilation, stride), first_output, count, q_first - shift))
    return out, phases


def take(t: torch.Tensor, axis: int, index: torch.Tensor) -> torch.Tensor:
    """t's entries at `index` along spatial `axis`, zero where the index falls outside."""
    dim = 2 + axis
    valid = (index >= 0) & (index < t.shape[dim])
    shape = list(t.shape)
    shape[dim] = len(index)
    out = torch.zeros(shape, dtype=t.dtype)
    out.index_copy_(dim, torch.nonzero(valid).flatten(), t.index_select(dim, index[valid]))
    return out


def reassemble(x, w, bias, stride, padding, output_padding, dilation):
    plans = [phase_plan_1d(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], output_padding[i], dilation[i])
             for i in range(3)]
    y = torch.zeros(x.shape[0], w.shape[1], *[out for out, _ in plans], dtype=x.dtype)
    for phases in itertools.product(*[p for _, p in plans]):
        if any(p.count == 0 or not p.taps for p in phases):
            continue  # outside the output, or no tap reaches it: only the bias, added below
        sub = w
        for axis, p in enumerate(phases):
            sub = sub.index_select(2 + axis, torch.tensor(p.taps))
        part = F.conv_transpose3d(x, sub, stride=1, padding=0, dilation=tuple(p.dilation for p in phases))
        for axis, p in enumerate(phases):
            part = take(part, axis, torch.arange(p.count) + p.offset)
        y[(slice(None), slice(None)) + tuple(slice(p.first_output, None, s) for p, s in zip(phases, stride))] = part
    return y if bias is None else y + bias.view(1, -1, 1, 1, 1)


@pytest.mark.parametrize("stride,kernel,padding,output_padding,dilation", [
    ((2, 2, 2), (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1)),   # kernel == stride: one tap per phase (a GEMM)
    ((2, 2, 2), (4, 4, 4), (1, 1, 1), (0, 0, 0), (1, 1, 1)),   # GAN generator
    ((2, 2, 2), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),   # video decoder, output_padding
    ((3, 2, 1), (2, 3, 4), (0, 1, 2), (2, 1, 0), (1, 1, 1)),   # kernel < stride: empty phases
    ((2, 3, 2), (3, 3, 2), (1, 0, 1), (1, 2, 0), (2, 1, 3)),   # dilation sharing factors with stride
])
def test_phases_reassemble_conv_transpose3d(stride, kernel, padding, output_padding, dilation):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, 4, *kernel, generator=g, dtype=torch.float64)
    b = torch.randn(4, generator=g, dtype=torch.float64)
    expected = F.conv_transpose3d(x, w, b, stride, padding, output_padding, 1, dilation)
    torch.testing.assert_close(reassemble(x, w, b, stride, padding, output_padding, dilation), expected,
                               rtol=1e-12, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(configurations(max_channels=4))
def test_phases_reassemble_any_configuration(config):
    assume(config["groups"] == 1 and config["batch"] > 0)
    a = make_inputs(config, torch.float64, "cpu", torch.Generator().manual_seed(2))
    expected = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                                  a["output_padding"], 1, a["dilation"])
    got = reassemble(a["input"].contiguous(), a["weight"], a["bias"], a["stride"], a["padding"],
                     a["output_padding"], a["dilation"])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
