"""The finishing kernel's bulk-copy path for NCDHW output (group_norm_finish_sm90.cu):
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
from cutlassfuse.testing import errors, fused_path_expected, poison_cuda_allocator, reference_float64

pytestmark = pytest.mark.gpu

RELATIVE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
MAX_ABS = {torch.float16: 3e-2, torch.bfloat16: 2e-1}

# (batch, Cin, Cout, input size, kernel, dilation, groups, bias); output pixels per sample in the id.
CASES = [
    ("512px", 3, 32, 64, (6, 6, 6), 3, 1, 8, True),
    ("1000px_ragged_block", 2, 16, 128, (8, 8, 8), 3, 1, 16, False),
    ("8px_tiles_straddle_samples", 5, 8, 192, (2, 2, 2), 1, 1, 6, True),
    ("groups_across_boxes", 2, 24, 192, (4, 6, 8), 3, 1, 4, False),
    ("256ch_one_group", 1, 16, 256, (14, 14, 14), 3, 1, 1, True),
    ("256ch_group_per_channel", 2, 8, 256, (3, 4, 7), 2, 1, 256, False),
    ("74088px_dilated", 1, 16, 64, (38, 38, 38), 3, 2, 8, True),
    ("kb61_batch32_sized_down", 32, 64, 128, (6, 6, 6), 3, 1, 8, False),
]


def make_inputs(case, dtype):
    _, batch, cin, cout, size, kernel, dilation, groups, bias = case
    g = torch.Generator(device="cuda").manual_seed(zlib.crc32(case[0].encode()))
    x = torch.randn(batch, cin, *size, generator=g, device="cuda").to(dtype)
    w = (torch.randn(cin, cout, kernel, kernel, kernel, generator=g, device="cuda") * (cin * kernel**3) ** -0.5)
    return dict(input=x, weight=w.to(dtype),
                bias=(0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype) if bias else None,
                dilation=dilation, num_groups=groups,
                norm_weight=(1 + 0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype),
                norm_bias=(0.2 * torch.randn(cout, generator=g, device="cuda")).to(dtype))


def finishing_kernels(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA and "group_norm_finish" in e.name]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bulk_finish_matches_register_path_bits(case, dtype):
    if not fused_path_expected():
        pytest.skip("the fused sm90 path runs on sm_90 only")
    inputs = make_inputs(case, dtype)
    channels_last = {**inputs, "input": inputs["input"].contiguous(memory_format=torch.channels_last_3d)}
    batch, cout = inputs["input"].shape[0], inputs["weight"].shape[1]
    extent = [s + inputs["dilation"] * (inputs["weight"].shape[2] - 1) for s in inputs["input"].shape[2:]]
    poison_bytes = 8 * batch * cout * extent[0] * extent[1] * extent[2] * dtype.itemsize
    poison_cuda_allocator(poison_bytes)
    names = finishing_kernels(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**inputs))
    assert len(names) == 1 and "group_norm_finish_bulk_kernel" in names[0], names
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    assert out.is_contiguous() and torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference_float64(**inputs))
    assert err.relative <= RELATIVE[dtype] and err.max_abs <= MAX_ABS[dtype], err
    poison_cuda_allocator(poison_bytes)
    register_path = cutlassfuse.conv_transpose3d_relu_group_norm(**channels_last)
    assert "group_norm_finish_kernel" in finishing_kernels(
        lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**channels_last))[0]
    assert torch.equal(out, register_path.contiguous()), "bulk and register paths differ"
    poison_cuda_allocator(poison_bytes)
    assert torch.equal(out, cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)), "two runs differ"
