"""Bad arguments raise a clear Python exception naming the argument."""

import pytest
import torch

import cutlassfuse
from cutlassfuse.testing import op_arguments


def call(x=None, w=None, **kwargs):
    x = torch.rand(1, 8, 3, 3, 3) if x is None else x
    w = torch.randn(8, 8, 3, 3, 3) if w is None else w
    kwargs.setdefault("num_groups", 2)
    return cutlassfuse.conv_transpose3d_relu_group_norm(x, w, **kwargs)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(x=torch.rand(8, 3, 3, 3)), ValueError, "input must be 5-D"),
    (dict(w=torch.randn(8, 8, 3, 3)), ValueError, "weight must be 5-D"),
    (dict(w=torch.randn(4, 8, 3, 3, 3)), ValueError, r"weight.shape\[0\]"),
    (dict(num_groups=3), ValueError, "num_groups"),
    (dict(x=torch.rand(1, 0, 3, 3, 3), w=torch.randn(0, 8, 3, 3, 3)), ValueError, "only the batch"),
    (dict(x=torch.rand(1, 8, 3, 0, 3)), ValueError, "only the batch"),
    (dict(num_groups=0), ValueError, "num_groups"),
    (dict(norm_weight=torch.ones(7)), ValueError, "norm_weight must have shape"),
    (dict(norm_bias=torch.ones(8, 1)), ValueError, "norm_bias must have shape"),
    (dict(bias=torch.ones(8, dtype=torch.float64)), TypeError, "bias must have the input's dtype"),
    (dict(w=torch.randn(8, 8, 3, 3, 3, dtype=torch.float64)), TypeError, "weight dtype"),
    (dict(x=torch.randint(0, 3, (1, 8, 3, 3, 3))), TypeError, "floating-point"),
    (dict(stride=0), ValueError, "stride must be positive"),
    (dict(dilation=(1, 0, 1)), ValueError, "dilation must be positive"),
    (dict(padding=-1), ValueError, "padding must be non-negative"),
    (dict(output_padding=1), ValueError, "output_padding must be smaller"),
    (dict(stride=(1, 2)), ValueError, "stride must be an int or 3 ints"),
    (dict(groups=3), ValueError, "divisible by groups"),
    (dict(padding=3), ValueError, "output would be empty"),
    (dict(eps=-1.0), ValueError, "eps"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        call(**kwargs)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(packed_weight=torch.randn(8, 8, 3, 3, 3)), ValueError, "packed_weight must be weight.permute"),
    (dict(packed_weight=torch.randn(8, 3, 3, 3, 8, dtype=torch.float64)), TypeError, "packed_weight must have"),
    (dict(packed_bias=torch.ones(8)), ValueError, "packed_bias given without a bias"),
    (dict(bias=torch.ones(8), stride=2, packed_bias=torch.ones(8)), ValueError, r"bias.repeat\(prod\(stride\)\), 64"),
    (dict(bias=torch.ones(8), packed_bias=torch.ones(8, dtype=torch.float64)), TypeError, "packed_bias must have"),
])
def test_bad_packed_operands(kwargs, error, match):
    """The op's packed_weight and packed_bias, which the module passes."""
    args = dict(input=torch.rand(1, 8, 3, 3, 3), weight=torch.randn(8, 8, 3, 3, 3), num_groups=2, **kwargs)
    with pytest.raises(error, match=match):
        torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(*op_arguments(args))


def test_zero_batch_gives_empty_output_like_pytorch():
    out = call(x=torch.rand(0, 8, 3, 3, 3))
    assert out.shape == (0, 8, 5, 5, 5)
