"""The op under torch.autocast (its CPU kernel here; the CUDA one is the same template):
the convolution's operands in the autocast dtype, as nn.ConvTranspose3d's are."""

import torch

import cutlassfuse
from cutlassfuse.testing import RELATIVE_TOLERANCE, errors, op_arguments, packed_operands


def test_module_runs_in_the_autocast_dtype_and_trains_float32_parameters():
    torch.manual_seed(0)
    block = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True, stride=2)
    x = torch.rand(2, 8, 4, 4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(x)
    assert out.dtype == torch.bfloat16
    expected = block.group_norm(torch.relu(block.conv_transpose(x.double().float())))
    assert errors(out, expected).relative <= RELATIVE_TOLERANCE[torch.bfloat16]
    out.float().square().sum().backward()
    for p in block.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32


def test_packed_arguments_of_another_dtype_are_dropped():
    torch.manual_seed(0)
    args = dict(input=torch.rand(1, 8, 3, 3, 3), weight=torch.randn(8, 8, 2, 2, 2), bias=torch.randn(8), stride=2,
                num_groups=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with_packed = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(
            *op_arguments(dict(args, **packed_operands(args))))
        plain = cutlassfuse.conv_transpose3d_relu_group_norm(**args)
    assert with_packed.dtype == torch.bfloat16 and torch.equal(with_packed, plain)
