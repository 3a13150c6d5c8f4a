"""Property-based: on any valid configuration the CPU op in float64 equals the float64
result computed from the definitions (cutlassfuse.testing.reference_by_definition, no
PyTorch convolution or normalization kernel: a mismatch means wrong plumbing of an
argument, a memory-format slip or a validation hole), and its fake kernel predicts the
result."""

import torch
from hypothesis import example, given, settings
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlassfuse
from cutlassfuse.testing import make_inputs, reference_by_definition

from strategies import configurations  # tests/strategies.py (tests/ is on sys.path via conftest)


@settings(max_examples=150, deadline=None)
@given(configurations())
def test_cpu_op_equals_the_definition(config):
    a = make_inputs(**config, dtype=torch.float64, seed=0)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    # Float64 sums in another order: differences of a few ulps of the convolution, which
    # GroupNorm scales up by at most 1 / sqrt(eps) (eps >= 1e-5).
    torch.testing.assert_close(out, reference_by_definition(**a), rtol=1e-9, atol=1e-9, equal_nan=True)
    channels_last = a["input"].is_contiguous(memory_format=torch.channels_last_3d) and not a["input"].is_contiguous()
    if channels_last and out.numel() and min(out.shape[1:]) > 1:
        assert out.is_contiguous(memory_format=torch.channels_last_3d)


@settings(max_examples=60, deadline=None)
@given(configurations())
@example(dict(batch=1, in_channels=2, out_channels=2, size=(1, 1, 3), kernel=(1, 1, 1), stride=(1, 1, 2),
              padding=(0, 0, 2), output_padding=(0, 0, 0), dilation=(1, 1, 1), groups=1, num_groups=1, bias=False,
              affine=False, channels_last=True, eps=1e-5))  # a 1x1x1 output: both layouts at once
def test_fake_kernel_predicts_shape_and_strides(config):
    a = make_inputs(**config, seed=1)
    real = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    with FakeTensorMode() as mode:
        fake_args = {k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in a.items()}
        fake = cutlassfuse.conv_transpose3d_relu_group_norm(**fake_args)
    assert fake.shape == real.shape and fake.dtype == real.dtype
    # Only strides of dimensions longer than one mean anything (the rule of PyTorch's own
    # check_significant_strides): a (1, C, 1, 1, 1) output is both layouts at once.
    assert significant_strides(fake) == significant_strides(real)


def significant_strides(t: torch.Tensor) -> tuple:
    if t.numel() == 0:
        return ()
    return tuple(stride for size, stride in zip(t.shape, t.stride(), strict=True) if size > 1)
