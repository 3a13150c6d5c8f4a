"""The fused path's launches: two kernels, the deconvolution and the finishing
kernel (its first blocks finalize the GroupNorm statistics, the others normalize),
plus the one layout conversion of an NCDHW input the conv cannot read as it is. Calls
on concurrent streams, whose finishing blocks wait on one another, must all complete
with their sequential results."""

from __future__ import annotations

import pytest
import torch

import cutlassfuse
from cutlassfuse.testing import (RELATIVE_TOLERANCE, device_operations, errors, make_inputs, op_arguments,
                                 packed_operands, poison_cuda_allocator, reference_float64)

pytestmark = [pytest.mark.gpu, pytest.mark.requires_sm90]


def layer_call(seed, batch=2, size=(8, 16, 16), kernel=3, stride=1, channels_last=False, num_groups=8) -> dict:
    """A layer's float16 call, 64 -> 128 channels with bias: the packed weight and bias its
    module caches (without them the op permutes the weight, and repeats the bias for the
    pixel-shuffle GEMM)."""
    inputs = make_inputs(batch=batch, in_channels=64, out_channels=128, size=size, kernel=kernel, stride=stride,
                         num_groups=num_groups, affine=False, channels_last=channels_last, dtype=torch.float16,
                         device="cuda", seed=seed)
    return dict(inputs, **packed_operands(inputs))


def run(args: dict) -> torch.Tensor:
    """The layer's call, packed operands included (the op's own arguments, as the module passes them)."""
    return torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*op_arguments(args))


def assert_operations(names: list[str], expected: list[str]) -> None:
    assert len(names) == len(expected) and all(key in name for key, name in zip(expected, names, strict=True)), names


LAYOUTS = [
    ("channels_last", 3, 1, []),
    ("ncdhw", 3, 1, ["ncdhw_to_ndhwc"]),
    ("channels_last_stride2", 3, 2, []),  # eight sub-pixel phases in one launch
    ("ncdhw_pixel_shuffle", 2, 2, []),  # kernel == stride: the GEMM reads the NCDHW input as it is
]


@pytest.mark.parametrize("layout,kernel,stride,conversion", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_two_launches(layout, kernel, stride, conversion):
    args = layer_call(0, kernel=kernel, stride=stride, channels_last=layout.startswith("channels_last"))
    names = device_operations(lambda: run(args))
    assert_operations(names, [*conversion, "PingpongPhasesKernel", "group_norm_finish"])


def test_bf16x3_splits_each_operand_in_one_launch():
    """float32 mode "bf16x3": one kernel writes the input's bfloat16 pieces, one the
    filter's, then the two of every call."""
    inputs = make_inputs(batch=2, in_channels=64, out_channels=128, size=(8, 16, 16), kernel=3, stride=1,
                         num_groups=8, affine=False, channels_last=False, dtype=torch.float32, device="cuda", seed=0)
    args = dict(inputs, **packed_operands(inputs))
    with cutlassfuse.float32_mode("bf16x3"):
        names = device_operations(lambda: run(args))
    assert_operations(names, ["split_float32_kernel", "split_float32_blocks_kernel", "PingpongPhasesKernel",
                              "group_norm_finish"])


def test_whole_gpu_calls_on_concurrent_streams():
    """Four streams each run calls whose grids take every SM: finishing kernels whose
    blocks wait for other blocks' finalize must not deadlock by holding part of it."""
    cases = [layer_call(seed, batch=8) for seed in range(4)]
    expected = [run(c) for c in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    results = [[] for _ in cases]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        for stream, case, out in zip(streams, cases, results, strict=True):
            with torch.cuda.stream(stream):
                out.append(run(case))
    torch.cuda.synchronize()
    for outs, reference in zip(results, expected, strict=True):
        assert all(torch.equal(out, reference) for out in outs)


@pytest.mark.parametrize("layout", ["channels_last", "ncdhw"])
def test_finishing_kernel_with_more_items_than_resident_blocks(layout):
    """64 samples x 128 groups: the finalize blocks alone outnumber the blocks the GPU
    holds at once, so normalize blocks start while later samples are still finalizing."""
    args = layer_call(2, batch=64, size=(4, 8, 8), channels_last=layout == "channels_last", num_groups=128)
    poison_cuda_allocator(64 * 128 * 6 * 10 * 10 * 2)  # the fp16 output's bytes (6 x 10 x 10 pixels)
    out = run(args)
    reference = reference_float64(**{k: v for k, v in args.items() if not k.startswith("packed_")})
    err = errors(out, reference)
    assert err.relative <= RELATIVE_TOLERANCE[torch.float16] and err.max_abs <= 3e-2, err
    assert torch.equal(out, run(args))
