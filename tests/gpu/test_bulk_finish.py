"""The finishing kernel's bulk-copy path for NCDHW output (cpp/src/sm90/group_norm_finish.cu):
16-bit activations with whole 64-channel boxes and pixels per sample a multiple of 8.
Its output must be bit for bit the channels-last call's (the register path, in place)
transposed, close to float64, and fully written: sample planes shorter than the
64-pixel block, ragged last blocks, above 2^16 pixels, 64 to 256 channels, groups
within and across the 64-channel boxes."""

from __future__ import annotations

import zlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse.testing import errors, make_inputs, poison_cuda_allocator, reference_float64

pytestmark = [pytest.mark.gpu, pytest.mark.requires_sm90]

RELATIVE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
MAX_ABS = {torch.float16: 3e-2, torch.bfloat16: 2e-1}

# NCDHW layers of stride 1; output pixels per sample in the name.
CASES = {
    "512px": dict(batch=3, in_channels=32, out_channels=64, size=(6, 6, 6), kernel=3, num_groups=8),
    "1000px_ragged_block": dict(batch=2, in_channels=16, out_channels=128, size=(8, 8, 8), kernel=3, num_groups=16,
                                bias=False),
    "8px_tiles_straddle_samples": dict(batch=5, in_channels=8, out_channels=192, size=(2, 2, 2), kernel=1,
                                       num_groups=6),
    "groups_across_boxes": dict(batch=2, in_channels=24, out_channels=192, size=(4, 6, 8), kernel=3, num_groups=4,
                                bias=False),
    "256ch_one_group": dict(batch=1, in_channels=16, out_channels=256, size=(14, 14, 14), kernel=3, num_groups=1),
    "256ch_group_per_channel": dict(batch=2, in_channels=8, out_channels=256, size=(3, 4, 7), kernel=2,
                                    num_groups=256, bias=False),
    "74088px_dilated": dict(batch=1, in_channels=16, out_channels=64, size=(38, 38, 38), kernel=3, dilation=2,
                            num_groups=8),
    "kb61_batch32_sized_down": dict(batch=32, in_channels=64, out_channels=128, size=(6, 6, 6), kernel=3,
                                    num_groups=8, bias=False),
}


def finishing_kernels(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and "group_norm_finish" in e.name]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES)
def test_bulk_finish_matches_register_path_bits(case, dtype):
    inputs = make_inputs(**CASES[case], dtype=dtype, device="cuda", seed=zlib.crc32(case.encode()))
    channels_last = {**inputs, "input": inputs["input"].contiguous(memory_format=torch.channels_last_3d)}
    reference = reference_float64(**inputs)
    poison_bytes = 8 * reference.numel() * dtype.itemsize
    poison_cuda_allocator(poison_bytes)
    names = finishing_kernels(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**inputs))
    assert len(names) == 1 and "group_norm_finish_bulk_kernel" in names[0], names
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    assert out.is_contiguous() and torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference)
    assert err.relative <= RELATIVE[dtype] and err.max_abs <= MAX_ABS[dtype], err
    poison_cuda_allocator(poison_bytes)
    register_path = cutlassfuse.conv_transpose3d_relu_group_norm(**channels_last)
    assert "group_norm_finish_kernel" in finishing_kernels(
        lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**channels_last))[0]
    assert torch.equal(out, register_path.contiguous()), "bulk and register paths differ"
    poison_cuda_allocator(poison_bytes)
    assert torch.equal(out, cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)), "two runs differ"
