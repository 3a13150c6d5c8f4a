"""On the GPU: the modules' calls reach the ops' kernels without the dispatcher
(cutlassfuse.direct_calls), the CUDA kernel under no_grad and the Autograd kernel in grad
mode, with the op's output bit for bit (values, shape, strides), the op's gradients and
the op's errors; calls that the dispatcher has work for take the op."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import cutlassfuse
from cutlassfuse import (Conv3dNormActivation, ConvTranspose3dNormActivation, ConvTranspose3dReLUGroupNorm,
                         GroupNormActivation, direct_calls)

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
MODULES = {
    "conv3d_fallback": lambda: Conv3dNormActivation(16, 32, 3, stride=2, padding=1, activation="prelu"),
    "conv3d_fused": lambda: Conv3dNormActivation(32, 32, 3, padding=1, activation="leaky_relu", affine=True),
    "conv_transpose3d": lambda: ConvTranspose3dNormActivation(32, 32, 3, stride=2, padding=1, output_padding=1,
                                                              norm="group", num_groups=8, activation="silu"),
    "norm": lambda: GroupNormActivation(8, 32, activation="silu"),
    "conv_transpose3d_relu_group_norm": lambda: ConvTranspose3dReLUGroupNorm(32, 32, 3, 8, bias=True, stride=2,
                                                                             padding=1, output_padding=1),
}
# The ops whose kernels direct_calls holds, by its attribute names.
OPS = {"_OP": "conv_transpose3d_relu_group_norm", "_BLOCK": "conv3d_norm_activation", "_NORM": "group_norm_activation"}


@pytest.fixture
def direct(monkeypatch) -> list[str]:
    """The kernels called directly, in order: "<op>_cuda" or "<op>_autograd"."""
    calls = []

    def counting(kernel, name: str):
        def counted(*args):
            calls.append(name)
            return kernel(*args)
        return counted

    for attribute, op in OPS.items():
        kernels = getattr(direct_calls, attribute)
        monkeypatch.setattr(direct_calls, attribute, kernels._replace(
            cuda=counting(kernels.cuda, f"{op}_cuda"), autograd=counting(kernels.autograd, f"{op}_autograd")))
    return calls


def module_of(name: str, dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    module = MODULES[name]().cuda().to(dtype).eval()
    with torch.no_grad():
        for p in module.parameters():  # affine parameters away from their 1 and 0
            p.add_(torch.randn_like(p) * 0.1)
    return module


def input_of(module: nn.Module, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    channels = 32 if isinstance(module, GroupNormActivation) else conv_of(module).in_channels
    x = torch.randn(2, channels, 12, 12, 12, device="cuda", dtype=dtype)
    return x.contiguous(memory_format=CL) if channels_last else x


def conv_of(module: nn.Module) -> nn.Module:
    return module.conv_transpose if isinstance(module, ConvTranspose3dReLUGroupNorm) else module.conv


def op_output(module: nn.Module, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """The module's op through the dispatcher, with the module's arguments."""
    if isinstance(module, GroupNormActivation):
        return torch.ops.cutlassfuse.group_norm_activation.default(*module._op_arguments(x))
    if isinstance(module, ConvTranspose3dReLUGroupNorm):
        conv, norm = module.conv_transpose, module.group_norm
        return cutlassfuse.conv_transpose3d_relu_group_norm(
            x, conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding, conv.groups, conv.dilation,
            num_groups=norm.num_groups, norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps)
    args = module._op_arguments(x, tuple(getattr(module.conv, "output_padding", (0, 0, 0))), residual)
    return torch.ops.cutlassfuse.conv3d_norm_activation.default(*args)


def op_of(module: nn.Module) -> str:
    if isinstance(module, GroupNormActivation):
        return "group_norm_activation"
    if isinstance(module, ConvTranspose3dReLUGroupNorm):
        return "conv_transpose3d_relu_group_norm"
    return "conv3d_norm_activation"


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
    assert direct == [f"{op_of(module)}_cuda"]
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
    assert direct == ["conv3d_norm_activation_cuda"]
    assert torch.equal(out, expected)


def gradients(module: nn.Module, out: torch.Tensor, grad: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
    parameters = [p for p in module.parameters() if p.requires_grad]
    return list(torch.autograd.grad(out, [x, *parameters], grad))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", list(MODULES))
def test_grad_mode_goes_to_the_autograd_kernel_with_the_ops_output_and_gradients(direct, name, dtype):
    """A call recorded for its backward through the op's Autograd kernel, called
    directly, gives the op's output and gradients bit for bit."""
    module = module_of(name, dtype).train()
    x = input_of(module, dtype, channels_last=True).requires_grad_()
    expected = op_output(module, x)
    grad = torch.randn_like(expected)
    expected_grads = gradients(module, expected, grad, x)
    assert direct == []
    out = module(x)
    assert direct == [f"{op_of(module)}_autograd"]
    assert out.grad_fn is not None and out.grad_fn.name() == expected.grad_fn.name()
    assert out.shape == expected.shape and out.stride() == expected.stride()
    assert torch.equal(out, expected)
    for found, wanted in zip(gradients(module, out, grad, x), expected_grads, strict=True):
        assert torch.equal(found, wanted)


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
    assert direct == [f"{op_of(module)}_cuda"]
    assert type(through_kernel.value) is type(through_op.value)
    assert str(through_kernel.value) == str(through_op.value)
    good = input_of(module, torch.float16, channels_last=True)
    with torch.no_grad():
        assert torch.isfinite(module(good)).all()
