"""The fused path's launches (issue 3): the deconvolution kernel finalizes the GroupNorm
statistics after its last tile (a cooperative launch), so a call is two kernels, the
conv and the normalize, plus the one layout conversion of an NCDHW input that the conv
cannot read as it is; with set_cooperative_finalize(False) a finalize kernel does it,
bitwise the same. Whole-GPU cooperative launches on concurrent streams must all
complete with their sequential results."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import cutlassfuse
from cutlassfuse.testing import fused_path_expected

pytestmark = pytest.mark.gpu


def make(seed, batch=2, cin=64, cout=128, size=(8, 16, 16), kernel=3, stride=1, channels_last=False,
         dtype=torch.float16):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.rand(batch, cin, *size, generator=g, device="cuda").to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last_3d)
    fan_in = cin * kernel**3
    return dict(input=x, weight=(torch.randn(cin, cout, kernel, kernel, kernel, generator=g, device="cuda")
                                 * fan_in**-0.5).to(dtype),
                bias=(torch.randn(cout, generator=g, device="cuda") * 0.1).to(dtype), stride=stride, num_groups=8)


def device_operations(fn) -> list[str]:
    """Names of the kernels, copies and memsets one call runs on the GPU."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("layout,kernel,stride,expected", [
    ("channels_last", 3, 1, ["PingpongPhasesKernel", "group_norm_apply"]),
    ("ncdhw", 3, 1, ["ncdhw_to_ndhwc", "PingpongPhasesKernel", "group_norm_apply"]),
    # Eight sub-pixel phases in one launch.
    ("channels_last_stride2", 3, 2, ["PingpongPhasesKernel", "group_norm_apply"]),
    # kernel == stride: the pixel-shuffle GEMM reads the NCDHW input as it is.
    ("ncdhw_pixel_shuffle", 2, 2, ["PingpongPhasesKernel", "group_norm_apply"]),
])
def test_common_case_launches(layout, kernel, stride, expected):
    """A layer's calls, with the packed weight and bias its module caches (without them
    the op permutes the weight, and repeats the bias for the pixel-shuffle GEMM)."""
    if not fused_path_expected():
        pytest.skip("the fused sm90 path runs on sm_90 only")
    args = make(0, kernel=kernel, stride=stride, channels_last=layout.startswith("channels_last"))
    args.update(packed_weight=cutlassfuse.pack_weight(args["weight"]),
                packed_bias=cutlassfuse.pack_bias(args["bias"], stride))
    names = device_operations(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**args))
    assert len(names) == len(expected) and all(key in name for key, name in zip(expected, names, strict=True)), names


@pytest.mark.parametrize("stride,num_groups", [(1, 8), (2, 128)], ids=["one_phase", "eight_phases_group_per_channel"])
def test_finalize_kernel_gives_the_same_bits(stride, num_groups):
    """set_cooperative_finalize(False): three kernels (the finalize one after the conv),
    bitwise the result of the conv kernel's own finalize."""
    if not fused_path_expected():
        pytest.skip("the fused sm90 path runs on sm_90 only")
    args = make(1, batch=3, stride=stride, channels_last=True)
    args.update(num_groups=num_groups, packed_weight=cutlassfuse.pack_weight(args["weight"]),
                norm_weight=torch.rand(128, device="cuda"), norm_bias=torch.rand(128, device="cuda"))
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    cutlassfuse.set_cooperative_finalize(False)
    try:
        names = device_operations(lambda: cutlassfuse.conv_transpose3d_relu_group_norm(**args))
        out = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    finally:
        cutlassfuse.set_cooperative_finalize(True)
    assert [n for n in names if "group_norm_finalize" in n], names
    assert len(names) == 3, names
    assert torch.equal(out, expected)


def test_whole_gpu_calls_on_concurrent_streams():
    """Four streams each run calls whose grids take every SM: cooperative launches that
    must wait for the whole GPU, not deadlock by holding part of it."""
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
