"""Property-based on the GPU: 500 random configurations per run (half of them shaped
for the fused sm90 path, strides 1-3 included), fp16/bf16/fp32, NCDHW and
channels_last, against float64."""

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cutlassfuse
from cutlassfuse.testing import errors, make_inputs, poison_cuda_allocator, reference_float64
from strategies import configurations  # tests/strategies.py

# float32 is held to float64 and bitwise repeatable: PyTorch's strict, deterministic setting.
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

# A configuration passes on relative error, or on max abs error where the reference is
# near zero (groups of one element normalize to beta). fp32 runs with TF32 off
# (strict_float32), the float32 mode "pytorch" following that switch.
RELATIVE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5}
MAX_ABS = {torch.float16: 5e-2, torch.bfloat16: 2.5e-1, torch.float32: 1e-4}


@example(config=dict(batch=1, in_channels=1, out_channels=1, size=(1, 1, 1), kernel=(1, 1, 1), stride=(1, 1, 1),
                     padding=(0, 0, 0), output_padding=(1, 0, 0), dilation=(2, 1, 1), groups=1, num_groups=1,
                     bias=False, affine=False, channels_last=False, eps=1e-5),
          dtype=torch.float16)  # output_padding >= stride, which cuDNN rejects; groups of one element
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.one_of(configurations(max_channels=48, max_size=6),
                 configurations(max_channels=64, max_size=8, fused_friendly=True)),
       st.sampled_from([torch.float16, torch.bfloat16, torch.float32]))
def test_cuda_matches_float64(config, dtype):
    a = make_inputs(**config, dtype=dtype, device="cuda", seed=0)
    poison_cuda_allocator(1 << 22)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    reference = reference_float64(**a)
    assert out.shape == reference.shape and out.dtype == dtype
    if out.numel() == 0:
        return
    assert torch.isfinite(out).all(), cutlassfuse.explain(**a)
    err = errors(out, reference)
    assert err.relative <= RELATIVE[dtype] or err.max_abs <= MAX_ABS[dtype], f"{err} via {cutlassfuse.explain(**a)}"
