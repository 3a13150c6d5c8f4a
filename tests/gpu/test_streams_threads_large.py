"""Streams, threads and tensors past 2^31 elements. The op launches on the
current stream, keeps no mutable global state on the hot path, and either computes
large problems correctly (the GroupNorm kernels index with 64 bits) or routes them away
from the 32-bit CUTLASS problem shape: to the CUDA fallback when cuDNN can split the
batch under 2^31 elements per call (its kernels index with 64 bits), else to ATen."""

import threading

import pytest
import torch

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import Errors, fused_path_expected, make_inputs

pytestmark = pytest.mark.gpu


def make(seed, size=(6, 7, 8), **layer):
    """A float16 call, 32 -> 64 channels, kernel 3, padding 1."""
    return make_inputs(batch=2, in_channels=32, out_channels=64, size=size, kernel=3, padding=1, num_groups=8,
                       bias=False, affine=False, dtype=torch.float16, device="cuda", seed=seed, **layer)


def test_non_default_stream():
    args = make(0)
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = args["input"] * 1  # produced on the side stream: the op must run after it there
        out = cutlassfuse.conv_transpose3d_relu_group_norm(**{**args, "input": x})
    side.synchronize()
    assert torch.equal(out, expected)


def test_concurrent_threads():
    cases = [make(seed, size=(4 + seed, 5, 6)) for seed in range(4)]
    expected = [cutlassfuse.conv_transpose3d_relu_group_norm(**c) for c in cases]
    results, failures = {}, []

    def worker(index):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(10):
                    results[index] = cutlassfuse.conv_transpose3d_relu_group_norm(**cases[index])
            stream.synchronize()
        except Exception as error:  # surfaced below, with the thread's index
            failures.append((index, error))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for index, reference in enumerate(expected):
        assert torch.equal(results[index], reference), index


@pytest.mark.parametrize("batch,edge,conv_groups,path", [
    (1, 640, 1, "fused_sm90"),  # 2.10e9 elements per tensor: just below 2^31, the fused path
    (1, 650, 1, "reference"),   # 2.20e9 in one sample: past CUTLASS's and cuDNN's 32-bit limits
    (4, 410, 2, "fallback"),    # 2.21e9 over 4 samples (conv groups): cuDNN per sample, 64-bit kernels
], ids=["below_2^31_fused", "one_sample_above_2^31_reference", "batch_above_2^31_fallback"])
def test_tensors_around_two_to_the_31(batch, edge, conv_groups, path):
    # A pointwise deconvolution (kernel 1) over edge^3 voxels and 8 channels.
    if torch.cuda.get_device_properties(0).total_memory < 60 * 2**30:
        pytest.skip("needs 60 GiB of GPU memory")
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.rand(batch, 8, edge, edge, edge, generator=g, device="cuda", dtype=torch.float16)
    w = (torch.randn(8, 8 // conv_groups, 1, 1, 1, generator=g, device="cuda") * 0.5).to(torch.float16)
    taken = cutlassfuse.explain(x, w, groups=conv_groups, num_groups=2)
    assert taken.startswith(path if path != "fused_sm90" or fused_path_expected() else "fallback"), taken
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, groups=conv_groups, num_groups=2)
    assert out.numel() == batch * 8 * edge**3
    # Reference: the same math in fp32 through PyTorch, one sample at a time, compared
    # in depth slabs (float64 copies of the whole sample would not fit an 80 GB card).
    for n in range(batch):
        y = torch.nn.functional.conv_transpose3d(x[n:n + 1].float(), w.float(), groups=conv_groups).relu_()
        expected = torch.nn.functional.group_norm(y, 2)
        del y
        err = slab_errors(out[n:n + 1], expected)
        assert err.relative <= 5e-3, f"{taken}, sample {n}: {err}"


def slab_errors(actual, expected, slabs: int = 32) -> Errors:
    squared_diff = squared_reference = max_abs = 0.0
    for a, e in zip(actual.chunk(slabs, dim=2), expected.chunk(slabs, dim=2), strict=True):
        diff = a.double() - e.double()
        squared_diff += diff.square().sum().item()
        squared_reference += e.double().square().sum().item()
        max_abs = max(max_abs, diff.abs().max().item())
    return Errors(relative=(squared_diff / squared_reference) ** 0.5, max_abs=max_abs)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("lanes", [2, 4])
def test_phases_on_side_streams_match_one_stream(lanes):
    """Sub-pixel phases spread over side streams give the bitwise result of one stream,
    on the caller's (non-default) stream, also inside a CUDA graph."""
    args = make(3, size=(5, 6, 7), stride=2, output_padding=1)  # eight sub-pixel phases
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    with backends.flags(phase_streams=lanes):
        path = cutlassfuse.explain(**args)
        assert f"phases on {lanes} streams" in path, path
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
            graph.replay()
        side.synchronize()
    assert torch.equal(out, expected)
    assert torch.equal(captured, expected)
