"""On the GPU: a block module given channels-last input passes its op a channels-last
copy of the conv's weight, made once and kept while the weight is unchanged, with the
output bitwise that of the op given the weight itself; no copy where a gradient flows to
the weight, for NCDHW input, or during a CUDA graph capture."""

import pytest
import torch
from torch import nn

from cutlassfuse import Conv3dNormActivation, ConvTranspose3dNormActivation

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d


def block(transposed: bool, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    if transposed:
        module = ConvTranspose3dNormActivation(32, 32, 3, stride=2, padding=1, output_padding=1, norm="group",
                                               num_groups=8, activation="silu")
    else:
        module = Conv3dNormActivation(32, 32, 3, padding=1, activation="leaky_relu", affine=True)
    return module.cuda().to(dtype).eval()


def op_with_own_weight(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The op given the module's weight as it is (ATen converts it per call)."""
    arguments = list(module._op_arguments(x, tuple(getattr(module.conv, "output_padding", (0, 0, 0)))))
    arguments[1] = module.conv.weight
    return torch.ops.cutlassfuse.conv3d_norm_activation.default(*arguments)


def kept_weight(module: nn.Module) -> torch.Tensor | None:
    copy = module.__dict__.get("_packed", {}).get("weight")
    return None if copy is None or copy._entry is None else copy._entry[2]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("transposed", [False, True])
def test_channels_last_input_reads_a_kept_channels_last_weight(transposed, dtype):
    module = block(transposed, dtype)
    x = torch.randn(2, 32, 12, 12, 12, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    with torch.no_grad():
        out = module(x)
        kept = kept_weight(module)
        assert kept is not None and kept.is_contiguous(memory_format=CL)
        assert torch.equal(kept, module.conv.weight)
        passed = module._op_arguments(x, tuple(getattr(module.conv, "output_padding", (0, 0, 0))))[1]
        assert passed is kept  # the same copy, not another
        assert out.is_contiguous(memory_format=CL)
        assert torch.equal(out, op_with_own_weight(module, x))
        # Written in place: the next call converts the new values.
        module.conv.weight.mul_(-0.5)
        changed = module(x)
        assert not torch.equal(changed, out)
        assert torch.equal(changed, op_with_own_weight(module, x))
        assert torch.equal(kept_weight(module), module.conv.weight)


def test_no_copy_where_it_cannot_be_kept():
    module = block(False, torch.float16)
    x = torch.randn(2, 32, 12, 12, 12, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        module(x)  # NCDHW input: the weight as it is
    assert kept_weight(module) is None
    x_cl = x.contiguous(memory_format=CL).requires_grad_()
    out = module(x_cl)  # grad mode, the weight requires grad: the gradient must reach it
    assert kept_weight(module) is None
    out.float().sum().backward()
    assert module.conv.weight.grad is not None and x_cl.grad is not None
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        module(x_cl.detach())  # a call outside a capture keeps a copy ...
        module.clear_packed_cache()
        with torch.cuda.graph(graph):
            module(x_cl.detach())  # ... a capture never does: a replay must read the live weight
    assert kept_weight(module) is None
