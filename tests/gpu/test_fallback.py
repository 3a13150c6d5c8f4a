"""The CUDA fallback (cuDNN's transposed convolution, then cutlassfuse's ReLU +
GroupNorm statistics and normalize kernels) on what the fused sm90 path does not take:
channel counts TMA cannot align, conv groups, NCDHW and channels-last, bias and affine
on and off, float16/bfloat16/float32 (float32 with TF32 off: within 1e-4 of float64, where
PyTorch's TF32 default lands ~3e-3 away); and, with the fused path turned off, what it
does take. Poisoned outputs, two runs bitwise equal."""

from __future__ import annotations

import zlib

import pytest
import torch

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import errors, make_inputs, poison_cuda_allocator, reference_float64

# float32 is held to float64 and bitwise repeatable: PyTorch's strict, deterministic setting.
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

FP32_MAX_ABS = 1e-4
RELATIVE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
MAX_ABS = {torch.float16: 3e-2, torch.bfloat16: 2e-1}

CASES = {
    # the fused path's shape, unless it is turned off
    "kb61_small": dict(batch=4, in_channels=64, out_channels=128, size=(16, 16, 16), kernel=3, num_groups=8,
                       bias=False),
    "odd_channels": dict(batch=2, in_channels=3, out_channels=12, size=(5, 5, 5), kernel=3, num_groups=4),
    "odd_channels_strided": dict(batch=2, in_channels=5, out_channels=6, size=(4, 6, 5), kernel=4, stride=2,
                                 padding=1, num_groups=3, affine=False, channels_last=True),
    "conv_groups": dict(batch=2, in_channels=16, out_channels=32, size=(6, 6, 6), kernel=3, stride=2, padding=1,
                        output_padding=1, groups=4, num_groups=8),
    "conv_groups_channels_last": dict(batch=3, in_channels=24, out_channels=48, size=(5, 4, 6), kernel=2, stride=2,
                                      groups=3, num_groups=6, bias=False, channels_last=True),
    "group_per_channel": dict(batch=2, in_channels=8, out_channels=10, size=(7, 3, 5), kernel=3, padding=1,
                              num_groups=10),
}


def case_inputs(name: str, dtype: torch.dtype) -> dict:
    return make_inputs(**CASES[name], dtype=dtype, device="cuda", seed=zlib.crc32(f"{name}/{dtype}".encode()))


def run_poisoned(inputs: dict, numel: int) -> torch.Tensor:
    poison_cuda_allocator(8 * numel * inputs["input"].element_size())
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()
    return out


@pytest.fixture(params=[True, False], ids=["as_dispatched", "fused_path_off"])
def fused_path(request):
    with backends.flags(fused_path=request.param):
        yield request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("case", CASES)
def test_fallback_matches_float64(case, dtype, fused_path):
    inputs = case_inputs(case, dtype)
    path = cutlassfuse.explain(**inputs)
    if case != "kb61_small" or not fused_path:
        assert path.startswith("fallback"), path
    reference = reference_float64(**inputs)
    out = run_poisoned(inputs, reference.numel())
    assert out.shape == reference.shape and out.dtype == dtype
    channels_last = inputs["input"].is_contiguous(memory_format=torch.channels_last_3d) and not inputs[
        "input"].is_contiguous()
    assert out.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference)
    if dtype == torch.float32:
        assert err.max_abs <= FP32_MAX_ABS, f"{err} via {path}"
    else:
        assert err.relative <= RELATIVE[dtype] and err.max_abs <= MAX_ABS[dtype], f"{err} via {path}"
    assert torch.equal(out, run_poisoned(inputs, reference.numel())), "two runs differ"


def test_fallback_propagates_nan_like_eager():
    inputs = case_inputs("odd_channels", torch.float32)
    inputs["input"][0, 0, 2, 2, 2] = float("nan")
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    expected = reference_float64(**inputs)
    assert torch.equal(out.isnan(), expected.isnan())


@pytest.mark.requires_sm90
def test_fused_path_flag_sends_fused_shapes_to_the_fallback():
    inputs = case_inputs("kb61_small", torch.float16)
    assert cutlassfuse.explain(**inputs).startswith("fused_sm90")
    fused = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    with backends.flags(fused_path=False):
        path = cutlassfuse.explain(**inputs)
        assert path.startswith("fallback") and "because the fused path is turned off" in path, path
        fallback = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    reference = reference_float64(**inputs)
    assert errors(fallback, reference).relative <= RELATIVE[torch.float16]
    assert errors(fused, reference).relative <= RELATIVE[torch.float16]
