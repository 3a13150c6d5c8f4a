"""On the GPU: a block module passes the op a channels-last copy of the conv's weight
(``packed_weight``), made once and kept while the weight is unchanged, for the calls that
convolve channels-last (channels-last input; float16/bfloat16 input). The op reads it in
place of the weight there: the output is bitwise that of the op without it, one launch
fewer (the weight's copy), the weight's gradient the same; none during a CUDA graph
capture."""

import pytest
import torch
from torch import nn

from cutlassfuse import Conv3dNormActivation, ConvTranspose3dNormActivation
from cutlassfuse.testing import device_operations

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
BLOCKS = {
    "fallback": lambda: Conv3dNormActivation(16, 32, 3, stride=2, padding=1, activation="prelu"),
    "fused": lambda: Conv3dNormActivation(32, 32, 3, padding=1, activation="leaky_relu", affine=True),
    "transposed": lambda: ConvTranspose3dNormActivation(32, 32, 3, stride=2, padding=1, output_padding=1,
                                                        norm="group", num_groups=8, activation="silu"),
}


def block(name: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return BLOCKS[name]().cuda().to(dtype).eval()


PACKED_WEIGHT = -2  # the op's packed_weight argument; the residual follows it


def arguments(module: nn.Module, x: torch.Tensor) -> list:
    return list(module._op_arguments(x, tuple(getattr(module.conv, "output_padding", (0, 0, 0)))))


def without_packed(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The op as the module calls it, less the packed weight."""
    args = arguments(module, x)
    args[PACKED_WEIGHT] = None
    return torch.ops.cutlassfuse.conv3d_norm_activation.default(*args)


def kept_weight(module: nn.Module) -> torch.Tensor | None:
    copy = module.__dict__.get("_packed", {}).get("weight")
    return None if copy is None else copy.kept


def input_of(module: nn.Module, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = torch.randn(2, module.conv.in_channels, 12, 12, 12, device="cuda", dtype=dtype)
    return x.contiguous(memory_format=CL) if channels_last else x


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("name", list(BLOCKS))
def test_packed_weight_gives_the_same_output_with_one_launch_fewer(name, channels_last, dtype):
    module = block(name, dtype)
    x = input_of(module, dtype, channels_last)
    with torch.no_grad():
        out = module(x)
        packed = arguments(module, x)[PACKED_WEIGHT]
        if not channels_last and dtype == torch.float32:  # an NCDHW float32 convolution reads the weight as it is
            assert packed is None and kept_weight(module) is None
            return
        assert packed is kept_weight(module) and packed.is_contiguous(memory_format=CL)
        assert torch.equal(packed, module.conv.weight)
        assert arguments(module, x)[1] is module.conv.weight  # the output's layout follows the weight's
        assert torch.equal(out, without_packed(module, x))
        assert out.is_contiguous(memory_format=CL if channels_last else torch.contiguous_format)
        plain = device_operations(lambda: without_packed(module, x))
        assert len(plain) == len(device_operations(lambda: module(x))) + 1  # the weight's copy
        module.conv.weight.mul_(-0.5)  # in place: the next call packs the new values
        changed = module(x)
        assert not torch.equal(changed, out) and torch.equal(changed, without_packed(module, x))
        assert torch.equal(kept_weight(module), module.conv.weight)


@pytest.mark.parametrize("name", list(BLOCKS))
def test_gradients_flow_to_the_weight_itself(name):
    module = block(name, torch.float16)
    x = input_of(module, torch.float16, channels_last=True).requires_grad_()
    grad = torch.randn_like(module(x.detach()))
    results = []
    for call in (lambda: module(x), lambda: without_packed(module, x)):
        module.zero_grad(set_to_none=True)
        x.grad = None
        out = call()
        out.backward(grad)
        results.append((out.detach(), x.grad.clone(), module.conv.weight.grad.clone()))
    assert kept_weight(module) is not None and not kept_weight(module).requires_grad
    for packed, plain in zip(*results, strict=True):
        assert torch.equal(packed, plain)


def test_no_copy_during_a_capture():
    module = block("fallback", torch.float16)
    x = input_of(module, torch.float16, channels_last=True)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        module(x)  # a call outside a capture keeps a copy ...
        module.clear_packed_cache()
        with torch.cuda.graph(graph):
            module(x)  # ... a capture never does: a replay must read the live weight
    assert kept_weight(module) is None
