"""On the GPU: the block modules' inference calls reach the ops' CUDA kernels without the
dispatcher (cutlassfuse.direct_calls), with the op's output bit for bit (values, shape,
strides) and the op's errors; calls that the dispatcher has work for take the op."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from cutlassfuse import Conv3dNormActivation, ConvTranspose3dNormActivation, GroupNormActivation, direct_calls

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
MODULES = {
    "conv3d_fallback": lambda: Conv3dNormActivation(16, 32, 3, stride=2, padding=1, activation="prelu"),
    "conv3d_fused": lambda: Conv3dNormActivation(32, 32, 3, padding=1, activation="leaky_relu", affine=True),
    "conv_transpose3d": lambda: ConvTranspose3dNormActivation(32, 32, 3, stride=2, padding=1, output_padding=1,
                                                              norm="group", num_groups=8, activation="silu"),
    "norm": lambda: GroupNormActivation(8, 32, activation="silu"),
}
KERNELS = ("conv3d_norm_activation_cuda", "group_norm_activation_cuda")


@pytest.fixture
def direct(monkeypatch) -> list[str]:
    """The names of the CUDA kernels called directly, in order."""
    calls = []

    def counting(name: str):
        kernel = getattr(direct_calls, name)

        def counted(*args):
            calls.append(name)
            return kernel(*args)
        return counted

    for name in KERNELS:
        monkeypatch.setattr(direct_calls, name, counting(name))
    return calls


def module_of(name: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    module = MODULES[name]().cuda().to(dtype).eval()
    with torch.no_grad():
        for p in module.parameters():  # affine parameters away from their 1 and 0
            p.add_(torch.randn_like(p) * 0.1)
    return module


def input_of(module: nn.Module, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    channels = module.conv.in_channels if hasattr(module, "conv") else 32
    x = torch.randn(2, channels, 12, 12, 12, device="cuda", dtype=dtype)
    return x.contiguous(memory_format=CL) if channels_last else x


def op_output(module: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The module's op through the dispatcher, with the module's arguments."""
    if isinstance(module, GroupNormActivation):
        return torch.ops.cutlassfuse.group_norm_activation.default(*module._op_arguments(x))
    args = module._op_arguments(x, tuple(getattr(module.conv, "output_padding", (0, 0, 0))), residual)
    return torch.ops.cutlassfuse.conv3d_norm_activation.default(*args)


def kernel_of(module: nn.Module) -> str:
    return KERNELS[1] if isinstance(module, GroupNormActivation) else KERNELS[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("name", list(MODULES))
def test_inference_call_goes_direct_with_the_ops_output(direct, name, channels_last, dtype):
    module = module_of(name, dtype)
    x = input_of(module, dtype, channels_last)
    with torch.no_grad():
        expected = op_output(module, x)
        assert direct == []
        out = module(x)
    assert direct == [kernel_of(module)]
    assert out.shape == expected.shape and out.stride() == expected.stride()
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", ["conv3d_fallback", "conv3d_fused", "conv_transpose3d"])
def test_residual_goes_direct(direct, name):
    module = module_of(name, torch.float16)
    x = input_of(module, torch.float16, channels_last=True)
    with torch.inference_mode():
        residual = torch.randn_like(module(x))
        expected = op_output(module, x, residual)
        direct.clear()
        out = module(x, residual=residual)
    assert direct == [KERNELS[0]]
    assert torch.equal(out, expected)


@pytest.mark.parametrize("name", list(MODULES))
def test_grad_mode_with_parameters_requiring_grad_takes_the_op(direct, name):
    module = module_of(name, torch.float16)
    x = input_of(module, torch.float16, channels_last=True)
    out = module(x)
    assert direct == []
    out.float().square().sum().backward()
    assert all(p.grad is not None for p in module.parameters())


def test_dispatch_mode_sees_the_op(direct):
    class Log(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    module = module_of("conv3d_fused", torch.float16)
    x = input_of(module, torch.float16, channels_last=True)
    with torch.no_grad(), Log() as log:
        module(x)
    assert direct == []
    assert "cutlassfuse.conv3d_norm_activation.default" in log.ops


@pytest.mark.parametrize("name", list(MODULES))
def test_errors_are_the_ops(direct, name):
    """A wrong input raises through the CUDA kernel what it raises through the op (type
    and message), and the CUDA context stays usable."""
    module = module_of(name, torch.float16)
    x = torch.randn(2, 24, 8, 8, 8, device="cuda", dtype=torch.float16)  # channels the module does not take
    with torch.no_grad():
        with pytest.raises(Exception) as through_op:
            op_output(module, x)
        with pytest.raises(Exception) as through_kernel:
            module(x)
    assert direct == [kernel_of(module)]
    assert type(through_kernel.value) is type(through_op.value)
    assert str(through_kernel.value) == str(through_op.value)
    good = input_of(module, torch.float16, channels_last=True)
    with torch.no_grad():
        assert torch.isfinite(module(good)).all()
