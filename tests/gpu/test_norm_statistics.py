"""The GroupNorm statistics kernel on the tiles it picks for large and odd tensors: tiles
thousands of rows tall whose rows straddle two samples, many small samples per tile,
channels-last with channel counts that take element loads, NCDHW with an odd number of
pixels, InstanceNorm over many channels, groups spanning tile columns, an input not
16-byte aligned, and an activation with per-channel slopes before the norm; against
float64 and no further from it than eager in the same dtype, bitwise repeatable. The
standalone shapes run on the separate statistics, finalize and normalize kernels and
again with the resident kernel where it takes them (test_norm_resident.py)."""

from __future__ import annotations

import copy
import json
import os
import tempfile
import zlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import errors, poison_cuda_allocator

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# Where eager's error is tiny, a few units in the last place of the output's dtype.
FLOOR = {torch.float16: 8e-3, torch.bfloat16: 6e-2, torch.float32: 2e-5}

# (shape, num_groups)
SHAPES = {
    # 2 x 2.1M rows: tiles of about 10^4 rows (one wave on an H100), one straddling the samples; NCDHW pixels odd
    "tall_tiles_odd_pixels": ((2, 4, 129, 127, 131), 2),
    # 2 x 1.08M rows, pixels a multiple of 8 (NCDHW vectors), samples not a multiple of the tile
    "tall_tiles_vectors": ((2, 4, 96, 100, 113), 4),
    # channels-last rows of 6 channels: element loads
    "six_channels": ((2, 6, 64, 65, 67), 3),
    # InstanceNorm over 96 channels: a full and a half-full tile column
    "instance_96_channels": ((2, 96, 20, 21, 22), 96),
    # groups of 96 channels, each over two tile columns
    "groups_across_tile_columns": ((2, 192, 11, 12, 13), 2),
    # samples of 3 rows: many in each tile
    "three_pixel_samples": ((64, 20, 1, 1, 3), 5),
    # samples of one row: GroupNorm over the channels alone
    "one_pixel_samples": ((300, 12, 1, 1, 1), 4),
    # InstanceNorm of 64 samples x 512 channels: 32768 (sample, group) items to finalize
    "many_finalize_items": ((64, 512, 1, 2, 3), 512),
}


def seed_of(*key) -> int:
    return zlib.crc32("/".join(map(str, key)).encode())


def make_input(shape, dtype, channels_last: bool, seed: int) -> torch.Tensor:
    """N(0, 3^2) around per-channel means up to 20 away from zero: the statistics
    subtract shifts taken from the data, and a group's channels differ in mean."""
    generator = torch.Generator("cuda").manual_seed(seed)
    means = torch.randn(1, shape[1], 1, 1, 1, device="cuda", generator=generator) * 10
    x = (torch.randn(shape, device="cuda", generator=generator) * 3 + means).to(dtype)
    return x.contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)


def affine(channels: int, dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator("cuda").manual_seed(seed)
    weight = torch.rand(channels, device="cuda", generator=generator) + 0.5
    bias = torch.rand(channels, device="cuda", generator=generator) - 0.5
    return weight.to(dtype), bias.to(dtype)


def check_standalone(x: torch.Tensor, num_groups: int, seed: int) -> None:
    weight, bias = affine(x.shape[1], x.dtype, seed)
    assert cutlassfuse.explain_block(cutlassfuse.group_norm_activation, x, num_groups, weight, bias,
                                     activation="identity").startswith("norm:")
    expected = F.group_norm(x.double(), num_groups, weight.double(), bias.double())
    with torch.no_grad():
        poison_cuda_allocator(4 * x.numel() * x.element_size())
        out = cutlassfuse.group_norm_activation(x, num_groups, weight, bias, activation="identity")
        again = cutlassfuse.group_norm_activation(x, num_groups, weight, bias, activation="identity")
        reference = F.group_norm(x, num_groups, weight, bias)
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[x.dtype]), f"cutlassfuse {ours}, eager {theirs}"
    assert torch.equal(out, again), "two runs differ"


@pytest.mark.parametrize("resident_norm", [False, True], ids=["separate", "resident_where_taken"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("case", SHAPES)
def test_standalone_norm_against_float64(case, channels_last, dtype, resident_norm):
    shape, num_groups = SHAPES[case]
    seed = seed_of(case, channels_last, dtype)
    with backends.flags(resident_norm=resident_norm):
        check_standalone(make_input(shape, dtype, channels_last, seed), num_groups, seed)


def misaligned(x: torch.Tensor) -> torch.Tensor:
    """x's values and strides at a data pointer one element past a 16-byte boundary."""
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    view = storage[1:].as_strided(x.shape, x.stride())
    view.copy_(x)
    return view


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
def test_unaligned_input_against_float64(channels_last, dtype):
    seed = seed_of("unaligned", channels_last, dtype)
    x = misaligned(make_input((2, 16, 30, 31, 32), dtype, channels_last, seed))
    assert x.data_ptr() % 16 != 0
    assert x.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    check_standalone(x, 4, seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("activation", ["prelu", "silu"])
def test_activation_before_norm_on_tall_tiles(activation, channels_last, dtype):
    """A 1x1x1 convolution with bias, then PReLU (a slope per channel) or SiLU, then
    GroupNorm over 1.9M pixels a sample: the statistics add the bias and apply the
    activation as they read."""
    seed = seed_of("before", activation, channels_last, dtype)
    torch.manual_seed(seed)
    conv64 = nn.Conv3d(3, 12, 1).cuda().double()
    norm64 = nn.GroupNorm(4, 12).cuda().double()
    act64 = (nn.PReLU(12) if activation == "prelu" else nn.SiLU()).cuda().double()
    with torch.no_grad():
        conv64.bias.uniform_(-1, 1)
        norm64.weight.uniform_(0.5, 1.5)
        norm64.bias.uniform_(-0.5, 0.5)
        if activation == "prelu":
            act64.weight.uniform_(0.05, 0.5)
    conv, norm, act = (copy.deepcopy(m).to(dtype) for m in (conv64, norm64, act64))
    x = make_input((2, 3, 97, 99, 101), dtype, channels_last, seed)
    slopes = act.weight if activation == "prelu" else None
    assert cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, conv.weight, num_groups=4,
                                     activation=activation, activation_weight=slopes).startswith("fallback:")

    def block():
        return cutlassfuse.conv3d_norm_activation(x, conv.weight, conv.bias, num_groups=4, norm_weight=norm.weight,
                                                  norm_bias=norm.bias, activation=activation,
                                                  activation_weight=slopes, activation_before_norm=True)

    with torch.no_grad():
        expected = norm64(act64(conv64(x.double())))
        poison_cuda_allocator(4 * expected.numel() * x.element_size())
        out, again = block(), block()
        reference = norm(act(conv(x)))
    ours, theirs = errors(out, expected), errors(reference, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"
    assert torch.equal(out, again), "two runs differ"


def kernel_grids(fn, name: str) -> list[list[int]]:
    """The grid of each launch of a kernel whose name holds `name` in one call of `fn`, from
    torch.profiler's trace."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as trace:
            events = json.load(trace)["traceEvents"]
    return [event["args"]["grid"] for event in events
            if event.get("cat") == "kernel" and name in event.get("name", "")]


@pytest.mark.requires_sm90  # an H100's or H200's SM count: tiles within kMaxTileM rows on these shapes
@pytest.mark.parametrize("shape", [(1, 16, 128, 128, 128), (2, 32, 48, 48, 48)], ids=["segres_norm", "two_samples"])
def test_statistics_grid_is_one_wave(shape):
    """The statistics kernel launches about as many tiles as stay resident at once (three
    blocks per SM), each block reducing its tile once: no partly filled second wave."""
    x = make_input(shape, torch.float16, True, seed_of("one_wave", *shape))
    with backends.flags(resident_norm=False):
        grids = kernel_grids(lambda: cutlassfuse.group_norm_activation(x, 8, activation="relu"),
                             "norm_activation_stats_kernel")
    assert len(grids) == 1, grids
    blocks = grids[0][0] * grids[0][1] * grids[0][2]
    resident = torch.cuda.get_device_properties(x.device).multi_processor_count * 3
    assert 0.9 * resident <= blocks <= resident, (blocks, resident)
