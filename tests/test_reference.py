"""The CPU op against PyTorch's own composite and against float64, over the whole
ConvTranspose3d / GroupNorm parameter space."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.testing import RELATIVE_TOLERANCE, errors, reference_float64

# (batch, in, out, size, kernel, stride, padding, output_padding, dilation, conv groups, num_groups)
SHAPES = [
    (2, 8, 16, (4, 5, 6), (3, 3, 3), 1, 0, 0, 1, 1, 4),
    (1, 4, 8, (3, 3, 3), (2, 2, 2), 2, 0, 0, 1, 1, 8),
    (3, 6, 12, (5, 4, 3), (4, 4, 4), 2, 1, 0, 1, 1, 3),
    (2, 8, 8, (4, 4, 6), (3, 3, 3), 2, 1, 1, 1, 1, 2),
    (1, 4, 6, (3, 4, 5), (3, 2, 1), (1, 2, 3), (1, 0, 0), (0, 1, 2), (2, 1, 1), 1, 1),
    (2, 6, 9, (3, 3, 3), (3, 3, 3), 1, 2, 0, 2, 3, 3),
    (1, 3, 12, (2, 2, 2), (1, 1, 1), 1, 0, 0, 1, 1, 12),
]


def composite(x, w, b, stride, padding, output_padding, groups, dilation, num_groups, gamma, beta, eps):
    y = F.conv_transpose3d(x, w, b, stride, padding, output_padding, groups, dilation)
    return F.group_norm(F.relu(y), num_groups, gamma, beta, eps)


def make_case(shape, dtype, bias, affine, generator):
    n, cin, cout, size, kernel, stride, padding, output_padding, dilation, groups, num_groups = shape
    x = torch.randn(n, cin, *size, generator=generator).to(dtype)
    w = torch.randn(cin, cout // groups, *kernel, generator=generator).to(dtype) * 0.3
    b = torch.randn(cout, generator=generator).to(dtype) if bias else None
    gamma = (1 + 0.1 * torch.randn(cout, generator=generator)).to(dtype) if affine else None
    beta = (0.1 * torch.randn(cout, generator=generator)).to(dtype) if affine else None
    return dict(input=x, weight=w, bias=b, stride=stride, padding=padding, output_padding=output_padding,
                groups=groups, dilation=dilation, num_groups=num_groups, norm_weight=gamma, norm_bias=beta,
                eps=1e-5)


@pytest.mark.parametrize("bias,affine", list(itertools.product([False, True], repeat=2)))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[3])) + f"-k{s[4][0]}")
def test_cpu_op_equals_pytorch_composite(shape, bias, affine):
    case = make_case(shape, torch.float32, bias, affine, torch.Generator().manual_seed(0))
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**case)
    expected = composite(case["input"], case["weight"], case["bias"], case["stride"], case["padding"],
                         case["output_padding"], case["groups"], case["dilation"], case["num_groups"],
                         case["norm_weight"], case["norm_bias"], case["eps"])
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16],
                         ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "x".join(map(str, s[3])))
def test_cpu_op_against_float64(shape, dtype):
    case = make_case(shape, dtype, True, True, torch.Generator().manual_seed(1))
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
    torch.testing.assert_close(out, cutlassfuse.conv_transpose3d_relu_group_norm(x.contiguous(), w, num_groups=2))


def test_does_not_track_autograd_internally():
    x = torch.rand(1, 4, 3, 3, 3)
    w = torch.randn(4, 4, 3, 3, 3)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2)
    assert out.grad_fn is None
