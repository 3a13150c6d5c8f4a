"""The CPU op against the float64 result computed from the definitions and against
float64 in lower precisions, over the whole ConvTranspose3d / GroupNorm parameter space."""

import itertools

import pytest
import torch

import cutlassfuse
from cutlassfuse.testing import RELATIVE_TOLERANCE, errors, make_inputs, reference_by_definition, reference_float64

SHAPES = [
    dict(batch=2, in_channels=8, out_channels=16, size=(4, 5, 6), kernel=3, num_groups=4),
    dict(batch=1, in_channels=4, out_channels=8, size=(3, 3, 3), kernel=2, stride=2, num_groups=8),
    dict(batch=3, in_channels=6, out_channels=12, size=(5, 4, 3), kernel=4, stride=2, padding=1, num_groups=3),
    dict(batch=2, in_channels=8, out_channels=8, size=(4, 4, 6), kernel=3, stride=2, padding=1, output_padding=1,
         num_groups=2),
    dict(batch=1, in_channels=4, out_channels=6, size=(3, 4, 5), kernel=(3, 2, 1), stride=(1, 2, 3),
         padding=(1, 0, 0), output_padding=(0, 1, 2), dilation=(2, 1, 1), num_groups=1),
    dict(batch=2, in_channels=6, out_channels=9, size=(3, 3, 3), kernel=3, padding=2, dilation=2, groups=3,
         num_groups=3),
    dict(batch=1, in_channels=3, out_channels=12, size=(2, 2, 2), kernel=1, num_groups=12),
]


def shape_id(shape: dict) -> str:
    kernel = shape["kernel"] if isinstance(shape["kernel"], int) else shape["kernel"][0]
    return "x".join(map(str, shape["size"])) + f"-k{kernel}"


@pytest.mark.parametrize("bias,affine", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_cpu_op_equals_the_definition(shape, bias, affine):
    case = make_inputs(**shape, bias=bias, affine=affine, dtype=torch.float64, seed=0)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**case)
    torch.testing.assert_close(out, reference_by_definition(**case), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES[:4], ids=shape_id)
def test_cpu_op_against_float64(shape, dtype):
    case = make_inputs(**shape, dtype=dtype, seed=1)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**case)
    assert out.dtype == dtype
    err = errors(out, reference_float64(**case))
    assert err.relative <= RELATIVE_TOLERANCE[dtype], err


@pytest.mark.parametrize("input_cl,weight_cl", [(False, False), (True, False), (False, True), (True, True)])
def test_output_memory_format_follows_input_and_weight(input_cl, weight_cl):
    cl = torch.channels_last_3d
    x = torch.rand(2, 8, 3, 4, 5)
    w = torch.randn(8, 8, 3, 3, 3)
    x = x.contiguous(memory_format=cl) if input_cl else x
    w = w.contiguous(memory_format=cl) if weight_cl else w
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=4)
    expected_format = cl if (input_cl or weight_cl) else torch.contiguous_format
    assert out.is_contiguous(memory_format=expected_format)


def test_non_contiguous_input_view():
    base = torch.rand(2, 8, 6, 6, 6)
    x = base[:, :, ::2, 1:, :5]
    w = torch.randn(8, 8, 2, 2, 2)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2)
    torch.testing.assert_close(out, reference_by_definition(x, w, num_groups=2).float(), rtol=1e-5, atol=1e-5)

