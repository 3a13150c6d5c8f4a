"""Property-based: on any valid configuration the CPU op equals PyTorch's composite
(same ATen kernels underneath: a mismatch means wrong plumbing of an argument, a
memory-format slip or a validation hole), and its fake kernel predicts the result."""

import torch
import torch.nn.functional as F
from hypothesis import example, given, settings
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlassfuse

from strategies import configurations, make_inputs  # tests/strategies.py (tests/ is on sys.path via conftest)


def composite(a: dict) -> torch.Tensor:
    y = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"])
    # torch.group_norm: F.group_norm refuses groups of one element, which normalize to beta.
    return torch.group_norm(F.relu(y), a["num_groups"], a["norm_weight"], a["norm_bias"], a["eps"])


@settings(max_examples=150, deadline=None)
@given(configurations())
def test_cpu_op_equals_composite(config):
    a = make_inputs(config, torch.float64, "cpu", torch.Generator().manual_seed(0))
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    expected = composite(a)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12, equal_nan=True)
    channels_last = a["input"].is_contiguous(memory_format=torch.channels_last_3d) and not a["input"].is_contiguous()
    if channels_last and out.numel() and min(out.shape[1:]) > 1:
        assert out.is_contiguous(memory_format=torch.channels_last_3d)


@settings(max_examples=60, deadline=None)
@given(configurations())
@example(dict(batch=1, in_channels=2, out_channels=2, size=(1, 1, 3), kernel=(1, 1, 1), stride=(1, 1, 2),
              padding=(0, 0, 2), output_padding=(0, 0, 0), dilation=(1, 1, 1), groups=1, num_groups=1, bias=False,
              affine=False, channels_last=True, eps=1e-5))  # a 1x1x1 output: both layouts at once
def test_fake_kernel_predicts_shape_and_strides(config):
    a = make_inputs(config, torch.float32, "cpu", torch.Generator().manual_seed(1))
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
