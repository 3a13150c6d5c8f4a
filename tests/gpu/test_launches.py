"""The fused path's launches (issue 3). By default the deconvolution kernel also
finalizes and normalizes each sample while it computes the later ones (the streamed
normalize): one kernel per call, after a memset of its progress counters and the one
layout conversion of an NCDHW input the conv cannot read as it is. Kernel == stride
layers (the pixel-shuffle GEMM's space-to-depth activation) run a finalize and a
normalize kernel after it; set_cooperative_finalize(True) moves the finalize into the
conv. Every mode gives bitwise the same results, and whole-GPU cooperative launches on
concurrent streams all complete with their sequential results."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse.testing import fused_path_expected, poison_cuda_allocator

pytestmark = pytest.mark.gpu


MODES = {  # (streamed normalize, cooperative finalize)
    "streamed": (True, False),
    "finalize_in_conv": (False, True),
    "separate_kernels": (False, False),
}


def set_mode(mode: str) -> None:
    streamed, cooperative = MODES[mode]
    cutlassfuse.set_streamed_normalize(streamed)
    cutlassfuse.set_cooperative_finalize(cooperative)


@pytest.fixture
def fused_modes():
    """Restores the defaults after a test that switches modes."""
    if not fused_path_expected():
        pytest.skip("the fused sm90 path runs on sm_90 only")
    yield set_mode
    set_mode("streamed")


def make(seed, batch=2, cin=64, cout=128, size=(8, 16, 16), kernel=3, stride=1, channels_last=False,
         dtype=torch.float16):
    """A layer's call: the packed weight and bias its module caches (without them the op
    permutes the weight, and repeats the bias for the pixel-shuffle GEMM)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(batch, cin, *size, generator=g, device="cuda").to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    fan_in = cin * kernel**3
    weight = (torch.randn(cin, cout, kernel, kernel, kernel, generator=g, device="cuda") * fan_in**-0.5).to(dtype)
    bias = (torch.randn(cout, generator=g, device="cuda") * 0.1).to(dtype)
    return dict(input=x, weight=weight, bias=bias, stride=stride, num_groups=8,
                packed_weight=cutlassfuse.pack_weight(weight), packed_bias=cutlassfuse.pack_bias(bias, stride))


def device_operations(fn) -> list[str]:
    """Names of the kernels, copies and memsets one call runs on the GPU."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def assert_operations(names: list[str], expected: list[str]) -> None:
    assert len(names) == len(expected) and all(key in name for key, name in zip(expected, names, strict=True)), names


LAYOUTS = [
    ("channels_last", 3, 1, []),
    ("ncdhw", 3, 1, ["ncdhw_to_ndhwc"]),
    ("channels_last_stride2", 3, 2, []),  # eight sub-pixel phases in one launch
]
PIXEL_SHUFFLE = ("ncdhw_pixel_shuffle", 2, 2, [])  # kernel == stride: the GEMM reads the NCDHW input as it is
ALL_LAYOUTS = [*LAYOUTS, PIXEL_SHUFFLE]


@pytest.mark.parametrize("layout,kernel,stride,conversion", LAYOUTS, ids=[c[0] for c in LAYOUTS])
def test_streamed_normalize_is_one_kernel(layout, kernel, stride, conversion, fused_modes):
    args = make(0, kernel=kernel, stride=stride, channels_last=layout.startswith("channels_last"))
    names = device_operations(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**args))
    assert_operations(names, [*conversion, "Memset", "PingpongPhasesKernel"])


@pytest.mark.parametrize("layout,kernel,stride,conversion", ALL_LAYOUTS, ids=[c[0] for c in ALL_LAYOUTS])
@pytest.mark.parametrize("mode,kernels", [
    ("finalize_in_conv", ["PingpongPhasesKernel", "group_norm_apply"]),
    ("separate_kernels", ["PingpongPhasesKernel", "group_norm_finalize", "group_norm_apply"]),
])
def test_launches_without_the_streamed_normalize(layout, kernel, stride, conversion, mode, kernels, fused_modes):
    fused_modes(mode)
    args = make(0, kernel=kernel, stride=stride, channels_last=layout.startswith("channels_last"))
    names = device_operations(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**args))
    assert_operations(names, [*conversion, *kernels])


def test_pixel_shuffle_gemm_keeps_the_normalize_kernel(fused_modes):
    args = make(0, kernel=2, stride=2)
    names = device_operations(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**args))
    assert_operations(names, ["PingpongPhasesKernel", "group_norm_finalize", "group_norm_apply"])


# Items (sample, group) fewer than CTAs and more; tiles holding several samples (a
# sample of 7 pixels); channels-last and NCDHW output; the three element types.
SAME_BITS = [
    dict(batch=3, stride=1, num_groups=8),
    dict(batch=3, stride=2, num_groups=128),
    dict(batch=16, stride=1, num_groups=64),
    dict(batch=32, stride=1, num_groups=16, size=(1, 1, 5), kernel=3),
    dict(batch=4, stride=2, num_groups=32, dtype=torch.bfloat16),
]


@pytest.mark.parametrize("case", SAME_BITS, ids=["cta_per_item", "eight_phases_group_per_channel",
                                                 "warp_per_item", "tiles_hold_many_samples", "bfloat16_stride2"])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "ncdhw"])
def test_every_mode_gives_the_same_bits(case, channels_last, fused_modes):
    args = make(1, channels_last=channels_last, **{k: v for k, v in case.items() if k != "num_groups"})
    args.update(num_groups=case["num_groups"], norm_weight=torch.rand(128, device="cuda"),
                norm_bias=torch.rand(128, device="cuda"))
    fused_modes("separate_kernels")
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    for mode in ("streamed", "finalize_in_conv"):
        fused_modes(mode)
        poison_cuda_allocator(4 * expected.nbytes)  # outputs and workspaces start as NaN
        assert torch.equal(cutlassfuse.conv_transpose3d_relu_group_norm(**args), expected), mode


@pytest.mark.parametrize("mode", ["streamed", "finalize_in_conv"])
def test_whole_gpu_calls_on_concurrent_streams(mode, fused_modes):
    """Four streams each run calls whose grids take every SM: cooperative launches that
    must wait for the whole GPU, not deadlock by holding part of it."""
    fused_modes(mode)
    cases = [make(seed, batch=8) for seed in range(4)]
    expected = [cutlassfuse.conv_transpose3d_relu_group_norm(**c) for c in cases]
    streams = [torch.cuda.Stream() for _ in cases]
    results = [[] for _ in cases]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(5):
        for stream, case, out in zip(streams, cases, results, strict=True):
            with torch.cuda.stream(stream):
                out.append(cutlassfuse.conv_transpose3d_relu_group_norm(**case))
    torch.cuda.synchronize()
    for outs, reference in zip(results, expected, strict=True):
        assert all(torch.equal(out, reference) for out in outs)
