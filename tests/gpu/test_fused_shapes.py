"""The fused sm90 path on random shapes chosen to hit its edge cases: tiles that
straddle samples (output D*H*W of 1, 7, not a multiple of the tile, above 2^16),
groups of one channel, of Cout/8 channels, of all channels, groups crossing an N-tile
boundary, padding 0-2, kernels 1-5, dilation 1-2, per-dimension strides 1-3 (sub-pixel
phases, pixels no input reaches), output_padding, batch 1 and 32, bias and affine on
and off; every kernel configuration; and outputs that do not change by one bit when
tiles skip the taps reaching none of their pixels, when CTAs draw their tiles from a
counter, or when phases run on several streams, on layers where explain() reports that
the feature ran."""

from __future__ import annotations

import random
import re
import zlib

import pytest
import torch

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.bench import parse_shape
from cutlassfuse.ops import transposed_conv_output_size
from cutlassfuse.testing import errors, fused_path_expected, make_inputs, poison_cuda_allocator, reference_float64

pytestmark = pytest.mark.gpu

# float32 takes the fused path only in the float32 mode "bf16x3", as bfloat16
# piece products; its bar is the measured accuracy of the tensor cores' float32
# accumulation (up to 6.7e-4 on an H100, float32_split.h), with margin. The default
# float32 mode, under PyTorch's strict setting, is held to 1e-4 in test_cuda_forward.py.
MAX_ABS = {torch.float16: 3e-2, torch.bfloat16: 2e-1, torch.float32: 1.5e-3}
RELATIVE = {torch.float16: 5e-3, torch.bfloat16: 2e-2, torch.float32: 5e-5}


@pytest.fixture
def float32_on_tensor_cores():
    with cutlassfuse.float32_mode("bf16x3"):
        yield


def output_size(c: dict) -> tuple[int, int, int]:
    def triple(value):
        return (value,) * 3 if isinstance(value, int) else tuple(value)

    return tuple(transposed_conv_output_size(c["size"], triple(c["kernel"]), c["stride"], triple(c["padding"]),
                                             c["output_padding"], triple(c["dilation"])))


def random_case(rng: random.Random, **fixed) -> dict:
    """A random valid configuration; `fixed` pins some of its values."""
    while True:
        c = dict(
            batch=rng.choice([1, 2, 3, 5, 32]),
            in_channels=8 * rng.randint(1, 16),
            out_channels=8 * rng.randint(2, 32),
            kernel=rng.choice([1, 2, 3, 4, 5]),
            padding=rng.choice([0, 1, 2]),
            dilation=rng.choice([1, 2]),
            size=tuple(rng.randint(1, 9) for _ in range(3)),
            stride=tuple(rng.choice([1, 1, 2, 2, 3]) for _ in range(3)),
            bias=rng.random() < 0.5,
            affine=rng.random() < 0.8,
            channels_last=rng.random() < 0.3,
        )
        c.update(fixed)
        if "output_padding" not in fixed:
            c["output_padding"] = tuple(rng.randrange(max(s, c["dilation"])) for s in c["stride"])
        cout = c["out_channels"]
        if "num_groups" not in fixed:
            c["num_groups"] = rng.choice([1, cout // 8, cout] + [g for g in (3, 5, 6, 12) if cout % g == 0])
        out = output_size(c)
        if min(out) >= 1 and c["batch"] * cout * out[0] * out[1] * out[2] <= 40_000_000:
            return c


def named_cases() -> list[dict]:
    rng = random.Random(2026)
    unit = dict(stride=(1, 1, 1), output_padding=(0, 0, 0))
    cases = [
        # output D*H*W == 1: every 128-row tile holds up to 128 samples
        random_case(rng, size=(1, 1, 1), kernel=1, padding=0, batch=32, **unit),
        # output D*H*W == 7
        random_case(rng, size=(7, 1, 1), kernel=1, padding=0, batch=5, **unit),
        # above 2^16 rows per sample, batch 1
        random_case(rng, size=(40, 40, 40), kernel=3, padding=0, dilation=1, batch=1, in_channels=16,
                    out_channels=32, num_groups=4, **unit),
        # groups of one channel / of Cout/8 channels / one group
        random_case(rng, out_channels=64, num_groups=64),
        random_case(rng, out_channels=256, num_groups=32),
        random_case(rng, out_channels=96, num_groups=1),
        # 48-channel groups cross the 128-channel N-tile boundary; 40-channel ones too
        random_case(rng, out_channels=192, num_groups=4),
        random_case(rng, out_channels=120, num_groups=3),
        # kernel 5 with padding 2, dilation 2
        random_case(rng, kernel=5, padding=2, dilation=2, size=(5, 6, 7)),
        # batch 32
        random_case(rng, batch=32, size=(4, 4, 4), kernel=3),
        # kernel == stride: every phase one tap (a GEMM); kernel < stride: unreached pixels
        random_case(rng, kernel=2, stride=(2, 2, 2), padding=0, dilation=1, output_padding=(0, 0, 0)),
        random_case(rng, kernel=1, stride=(2, 3, 1), padding=0, dilation=1, bias=True),
        random_case(rng, kernel=2, stride=(3, 3, 3), padding=1, dilation=1, bias=True),
        # dilation 2 with stride 2: the odd phases receive no tap
        random_case(rng, kernel=3, stride=(2, 2, 2), dilation=2, bias=True),
        # kernel == stride, no padding: one pixel-shuffle GEMM, normalize reorders (CL and NCDHW out)
        random_case(rng, kernel=3, stride=(3, 3, 3), padding=0, dilation=1, output_padding=(0, 0, 0), bias=True,
                    channels_last=True),
        random_case(rng, kernel=2, stride=(2, 2, 2), padding=0, dilation=1, output_padding=(0, 0, 0), bias=True,
                    channels_last=False, num_groups=1),
        # groups of 4 and 2 channels, narrower than a 16-byte vector, with stride 2 (the video shape's case)
        random_case(rng, out_channels=64, num_groups=16, kernel=3, stride=(2, 2, 2), padding=1, dilation=1),
        random_case(rng, out_channels=96, num_groups=48, kernel=3, stride=(1, 1, 1), output_padding=(0, 0, 0)),
        # kernel == stride on NCDHW input: the GEMM reads the input as it is, batched over the samples, whose
        # rows the statistics pad to whole tiles (96 and 320 pixels per sample; groups across N tiles)
        random_case(rng, batch=3, out_channels=48, num_groups=12, size=(4, 4, 6), **PIXEL_MAJOR),
        random_case(rng, batch=5, out_channels=64, num_groups=4, size=(8, 8, 5), **PIXEL_MAJOR),
        # 27 pixels per sample, not a multiple of 8 (TMA's row alignment): the transposed input instead
        random_case(rng, batch=2, size=(3, 3, 3), **PIXEL_MAJOR),
        # NCDHW output of 216, 50 and 105 pixels per sample (a multiple of 4, twice an odd number,
        # odd), each sample ending in a partial 64-row tile of the normalize's transpose
        random_case(rng, size=(6, 6, 6), kernel=1, padding=0, channels_last=False, **unit),
        random_case(rng, size=(5, 5, 2), kernel=1, padding=0, channels_last=False, **unit),
        random_case(rng, size=(3, 5, 7), kernel=1, padding=0, channels_last=False, **unit),
    ]
    return cases


PIXEL_MAJOR = dict(kernel=2, stride=(2, 2, 2), padding=0, dilation=1, output_padding=(0, 0, 0), bias=True,
                   channels_last=False)


def random_cases(count: int) -> list[dict]:
    rng = random.Random(2027)
    return [random_case(rng) for _ in range(count)]


NAMED_CASES = named_cases()
CASES = NAMED_CASES + random_cases(36)


def case_id(c: dict) -> str:
    return (f"n{c['batch']}-{c['in_channels']}to{c['out_channels']}-{'x'.join(map(str, output_size(c)))}"
            f"-k{c['kernel']}s{''.join(map(str, c['stride']))}p{c['padding']}"
            f"op{''.join(map(str, c['output_padding']))}d{c['dilation']}-g{c['num_groups']}"
            + ("-bias" if c["bias"] else "") + ("" if c["affine"] else "-noaffine")
            + ("-cl" if c["channels_last"] else ""))


def output_numel(c: dict) -> int:
    return c["batch"] * c["out_channels"] * torch.Size(output_size(c)).numel()


def case_inputs(c: dict, dtype: torch.dtype) -> dict:
    return make_inputs(**c, dtype=dtype, device="cuda", seed=zlib.crc32(case_id(c).encode()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_fused_path_matches_float64(case: dict, dtype: torch.dtype, float32_on_tensor_cores):
    inputs = case_inputs(case, dtype)
    if fused_path_expected():
        path = cutlassfuse.explain(**inputs)
        assert path.startswith("fused_sm90"), path
    numel = output_numel(case)
    poison_bytes = 8 * numel * dtype.itemsize
    poison_cuda_allocator(poison_bytes)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference_float64(**inputs))
    assert err.relative <= RELATIVE[dtype] and err.max_abs <= MAX_ABS[dtype], err
    poison_cuda_allocator(poison_bytes)
    assert torch.equal(out, cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)), "two runs differ"


@pytest.mark.requires_sm90
@pytest.mark.parametrize("size, reads_as_is", [((4, 4, 6), True), ((3, 3, 3), False)], ids=["96px", "27px"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "cl"])
def test_pixel_shuffle_gemm_reads_ncdhw_input_as_it_is(size, reads_as_is: bool, channels_last: bool):
    """explain() names the pixel-major GEMM exactly for NCDHW 16-bit inputs whose pixels per sample TMA can
    address (a multiple of 8); the others keep the transposed (or channels-last) input."""
    case = random_case(random.Random(7), batch=2, out_channels=64, num_groups=8, size=size,
                       **{**PIXEL_MAJOR, "channels_last": channels_last})
    for dtype, expected in [(torch.float16, reads_as_is and not channels_last), (torch.float32, False)]:
        path = cutlassfuse.explain(**case_inputs(case, dtype))
        assert ("reading the NCDHW input as it is" in path) == expected, path


# Every kernel configuration, whichever the heuristic picks: both tiles and both cluster
# sizes of the ping-pong kernel, on the named edge cases.
@pytest.fixture(params=backends.dgrad_configs())
def dgrad_config(request):
    with backends.flags(dgrad_config=request.param):
        yield request.param


@pytest.mark.parametrize("case", NAMED_CASES, ids=case_id)
def test_every_config_matches_float64(case: dict, dgrad_config: str):
    inputs = case_inputs(case, torch.float16)
    if fused_path_expected():
        assert dgrad_config in cutlassfuse.explain(**inputs)
    poison_cuda_allocator(8 * 2 * output_numel(case))
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference_float64(**inputs))
    assert err.relative <= RELATIVE[torch.float16] and err.max_abs <= MAX_ABS[torch.float16], err
    assert torch.equal(out, cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)), "two runs differ"


def run_poisoned(inputs: dict, numel: int) -> torch.Tensor:
    """The op's output, written into memory the allocator holds NaN in."""
    poison_cuda_allocator(8 * inputs["input"].element_size() * numel)
    return cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)


# Clusters change who loads the filter tile (each CTA of a pair loads half, multicast to
# both), not one product or sum: the 2x1 kernel must match the 1x1 kernel bit for bit,
# including the pairs whose second tile lies past the problem (an odd number of M tiles).
@pytest.mark.requires_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", NAMED_CASES[:3] + NAMED_CASES[10:14], ids=case_id)
def test_cluster_2x1_equals_cluster_1x1_bitwise(case: dict, dtype: torch.dtype):
    inputs = case_inputs(case, dtype)
    outputs = {}
    for config in ["128x128_pingpong", "128x128_pingpong_cluster2x1"]:
        with backends.flags(dgrad_config=config):
            assert f"{config} (epilogue" in cutlassfuse.explain(**inputs)
            outputs[config] = run_poisoned(inputs, output_numel(case))
    assert torch.isfinite(outputs["128x128_pingpong_cluster2x1"]).all()
    assert torch.equal(outputs["128x128_pingpong"], outputs["128x128_pingpong_cluster2x1"])


# Clusters of two CTAs for sub-pixel phases beyond one N tile; clusters of one, drawing
# their tiles, for stride-1 layers (kb61 and layers of two N tiles measured faster).
@pytest.mark.requires_sm90
@pytest.mark.parametrize(("out_channels", "batch", "size", "stride", "config"), [
    (64, 2, (30, 30, 30), 1, "128x64_pingpong"),
    (128, 2, (6, 6, 6), 1, "128x128_pingpong"),
    (128, 2, (30, 30, 30), 1, "128x128_pingpong"),
    (128, 2, (16, 16, 16), 2, "128x128_pingpong"),
    (136, 2, (6, 6, 6), 1, "128x128_pingpong"),
    (256, 2, (16, 16, 16), 1, "128x128_pingpong"),
    (136, 2, (6, 6, 6), 2, "128x128_pingpong_cluster2x1"),
    (256, 2, (6, 6, 6), 2, "128x128_pingpong_cluster2x1")])
def test_heuristic_pairs_ctas(out_channels: int, batch: int, size: tuple, stride: int, config: str):
    case = random_case(random.Random(11), out_channels=out_channels, batch=batch, size=size, num_groups=8, kernel=3,
                       padding=0, dilation=1, stride=(stride,) * 3, output_padding=(0, 0, 0))
    assert f"{config} (epilogue" in cutlassfuse.explain(**case_inputs(case, torch.float16))


# What explain() reports of the ping-pong kernel's features, under the current flags.
SKIPPED_PHASES = re.compile(r"border taps skipped in (\d+) of (\d+) phases")
DRAWN, WALKED = "tiles drawn from a counter", "tiles walked statically"


def on_and_off(inputs: dict, numel: int, flag: str, expect_on, expect_off, **pinned) -> torch.Tensor:
    """The op's output with a kernel feature's flag on (its default) and off, `pinned`
    flags set for both: explain() must report the feature running (expect_on(path)) and
    not running (expect_off(path)); the outputs, written into poisoned memory, finite
    and equal bit for bit."""
    outputs = []
    for enabled, expect in ((True, expect_on), (False, expect_off)):
        with backends.flags(**pinned, **{flag: enabled}):
            path = cutlassfuse.explain(**inputs)
            assert expect(path), f"{flag}={enabled}: {path}"
            outputs.append(run_poisoned(inputs, numel))
    on, off = outputs
    assert torch.isfinite(on).all(), "unwritten (poisoned) or non-finite output elements"
    assert torch.equal(on, off), f"{flag} on and off differ"
    return on


def skipped_in_some_phase(path: str) -> bool:
    match = SKIPPED_PHASES.search(path)
    return match is not None and int(match[1]) > 0


def skipped_in_no_phase(path: str) -> bool:
    match = SKIPPED_PHASES.search(path)
    return match is not None and int(match[1]) == 0


# Skipping the K blocks of depth taps that reach none of a tile's pixels (tap_window.h) drops
# only blocks the im2col loads fill with zeros, and walks the rest in the same order:
# the output must not change by one bit. The host skips in the phases whose 128-pixel
# tiles skip more than one K block on average (planes of more than 128 pixels, several
# depth taps); each layer below has such phases, so explain() must report skipping on,
# and off when the flag is off.
PINGPONG_CONFIGS = ["128x128_pingpong", "128x64_pingpong", "128x128_pingpong_cluster2x1"]


# The benchmark layer kb61_v0: output planes of 18x18 pixels, ten per sample; a tile skips
# 5 of its 27 K blocks on average.
KB61_V0 = dict(parse_shape("kb61_v0").make_inputs_keywords(), stride=(1, 1, 1), output_padding=(0, 0, 0), dilation=1,
               bias=False, affine=True, channels_last=False)


def border_cases() -> list[dict]:
    rng = random.Random(15)
    unit = dict(stride=(1, 1, 1), output_padding=(0, 0, 0))
    return [
        KB61_V0,
        # kernel 5, dilation 2, padding 2: 43 of 125 K blocks skipped per tile
        random_case(rng, batch=2, in_channels=64, out_channels=64, num_groups=8, size=(10, 12, 12), kernel=5,
                    padding=2, dilation=2, **unit),
        # dilation 2, a channel block half empty (32 input channels)
        random_case(rng, batch=3, in_channels=32, out_channels=96, num_groups=12, size=(12, 12, 12), kernel=3,
                    padding=0, dilation=2, **unit),
        # 136 channels: a ragged third channel block, two N tiles
        random_case(rng, batch=2, in_channels=136, out_channels=136, num_groups=17, size=(6, 16, 16), kernel=3,
                    padding=1, dilation=1, **unit),
        # sub-pixel phases that skip (every phase of kernel 4, stride 2; 256 input channels)
        random_case(rng, batch=2, in_channels=256, out_channels=128, num_groups=32, size=(8, 12, 12), kernel=4,
                    stride=(2, 2, 2), padding=1, dilation=1, output_padding=(0, 0, 0)),
        # phases of one launch that skip and that do not (kernel 3, stride 2, output_padding 1)
        random_case(rng, batch=2, in_channels=256, out_channels=64, num_groups=16, size=(8, 12, 12), kernel=3,
                    stride=(2, 2, 2), padding=1, dilation=1, output_padding=(1, 1, 1)),
        # 64 -> 128 channels, 16^3 input, kernel 3: 18 planes of 324 pixels, a tile skips 2.7 K blocks on average
        random_case(rng, batch=2, in_channels=64, out_channels=128, num_groups=8, size=(16, 16, 16), kernel=3,
                    padding=0, dilation=1, **unit),
    ]


BORDER_CASES = border_cases()


@pytest.mark.requires_sm90
@pytest.mark.parametrize("config", PINGPONG_CONFIGS)
@pytest.mark.parametrize("case", BORDER_CASES, ids=case_id)
def test_skipping_border_taps_changes_no_bit(case: dict, config: str):
    on_and_off(case_inputs(case, torch.float16), output_numel(case), "skip_border_taps", skipped_in_some_phase,
               skipped_in_no_phase, dgrad_config=config)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", BORDER_CASES, ids=case_id)
def test_skipping_border_taps_changes_no_bit_in_other_dtypes(case: dict, dtype: torch.dtype,
                                                             float32_on_tensor_cores):
    on_and_off(case_inputs(case, dtype), output_numel(case), "skip_border_taps", skipped_in_some_phase,
               skipped_in_no_phase)


# Drawn tile schedule (unit_schedule.cuh): the CTAs of clusters of one draw their third
# and later tiles from a counter in the call's workspace, which no launch zeroes, where a
# launch's tiles skip border taps and outnumber two per CTA. Which CTA computes a tile
# must change no bit; launches running at once (phase streams) need counters of their
# own; a CUDA graph replaying the launches (same counter, same epoch) must find the
# counter ready again every time.
def drawing_cases() -> list[dict]:
    rng = random.Random(18)
    unit = dict(stride=(1, 1, 1), output_padding=(0, 0, 0), dilation=1, kernel=3)
    return [
        KB61_V0,  # 405 tiles of 3,240-pixel samples (tiles straddle samples)
        # two N tiles: 294 units
        random_case(rng, batch=8, in_channels=64, out_channels=256, num_groups=16, size=(10, 12, 12), padding=0,
                    **unit),
        # a ragged second N tile (136 channels), padding 1: 490 units
        random_case(rng, batch=16, in_channels=64, out_channels=136, num_groups=17, size=(10, 14, 14), padding=1,
                    **unit),
        # 64 output channels (128x64 tiles by default): 405 units
        random_case(rng, batch=16, in_channels=32, out_channels=64, num_groups=8, size=(8, 16, 16), padding=0,
                    **unit),
    ]


DRAWING_CASES = drawing_cases()
# Eight sub-pixel phases (kernel 4, stride 2, padding 1) of 288 tiles each that skip taps.
DRAWING_PHASES = random_case(random.Random(19), batch=18, in_channels=256, out_channels=128, num_groups=32,
                             size=(8, 16, 16), kernel=4, stride=(2, 2, 2), padding=1, dilation=1,
                             output_padding=(0, 0, 0))


def drawn(path: str) -> bool:
    return DRAWN in path and WALKED not in path and skipped_in_some_phase(path)


def walked(path: str) -> bool:
    return WALKED in path and DRAWN not in path


@pytest.mark.requires_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("config", ["auto", "128x128_pingpong", "128x64_pingpong"])
@pytest.mark.parametrize("case", DRAWING_CASES + [DRAWING_PHASES], ids=case_id)
def test_drawn_tile_schedule_changes_no_bit(case: dict, config: str, dtype: torch.dtype):
    inputs = case_inputs(case, dtype)
    out = on_and_off(inputs, output_numel(case), "drawn_tile_schedule", drawn, walked, dgrad_config=config)
    if config == "auto":
        tolerance = 2e-2 if dtype == torch.bfloat16 else 5e-3
        assert errors(out, reference_float64(**inputs)).relative <= tolerance


@pytest.mark.requires_sm90
def test_clusters_of_two_walk_their_tiles_statically():
    """The CTAs of a pair must take the same tiles in step: no drawing, whatever the flag."""
    inputs = case_inputs(DRAWING_CASES[0], torch.float16)
    with backends.flags(dgrad_config="128x128_pingpong_cluster2x1"):
        assert walked(cutlassfuse.explain(**inputs))


@pytest.mark.requires_sm90
@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_phase_streams_change_no_bit(lanes: int):
    """Each phase its own launch on one of `lanes` streams, all drawing at once from
    counters of their own."""
    inputs = case_inputs(DRAWING_PHASES, torch.float16)
    one_stream = run_poisoned(inputs, output_numel(DRAWING_PHASES))
    with backends.flags(phase_streams=lanes):
        path = cutlassfuse.explain(**inputs)
        assert f"phases on {lanes} streams" in path and drawn(path), path
        on_streams = run_poisoned(inputs, output_numel(DRAWING_PHASES))
    assert torch.isfinite(on_streams).all(), "unwritten (poisoned) or non-finite output elements"
    assert torch.equal(on_streams, one_stream)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("case", DRAWING_CASES[:2] + [DRAWING_PHASES], ids=case_id)
def test_drawn_tile_schedule_in_cuda_graph_replays(case: dict):
    inputs = case_inputs(case, torch.float16)
    assert drawn(cutlassfuse.explain(**inputs))
    static_input = inputs["input"].clone()
    captured = dict(inputs, input=static_input)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cutlassfuse.conv_transpose3d_relu_group_norm(**captured)  # warm-up off the graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = cutlassfuse.conv_transpose3d_relu_group_norm(**captured)
    torch.cuda.current_stream().wait_stream(stream)
    for replay in range(3):
        static_input.copy_(torch.randn_like(static_input))
        replayed.fill_(float("nan"))
        graph.replay()
        expected = cutlassfuse.conv_transpose3d_relu_group_norm(**dict(inputs, input=static_input))
        assert torch.equal(replayed, expected), f"replay {replay}"
