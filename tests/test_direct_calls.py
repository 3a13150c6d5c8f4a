"""When the modules call the ops' kernels without the dispatcher (cutlassfuse.direct_calls):
only where the dispatcher would pass the call straight to its backend's kernel, or to its
Autograd kernel when a tensor requires grad in grad mode. Each other thing the dispatcher
does on the way (autocast, functorch, forward-mode AD, torch function and dispatch
modes, the profiler, tracing, compiling, tensor subclasses and layouts) turns the direct
call off."""

import pytest
import torch
import torch.fx
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import cutlassfuse
from cutlassfuse import direct_calls

POSITIONS = direct_calls.BLOCK_TENSOR_POSITIONS


def block_arguments(x: torch.Tensor | None = None, weight: torch.Tensor | None = None, residual=None) -> tuple:
    """The block op's arguments: a Conv3d 4 -> 8, InstanceNorm, ReLU after the norm."""
    x = torch.randn(1, 4, 4, 4, 4) if x is None else x
    weight = nn.Parameter(torch.randn(8, 4, 3, 3, 3)) if weight is None else weight
    return (x, weight, None, (1, 1, 1), (1, 1, 1), (0, 0, 0), 1, (1, 1, 1), False, 8, None, None, 1e-5, "relu", 0.0,
            None, False, None, residual)


def test_schema_positions_are_the_tensors():
    schemas = {
        direct_calls.OP_TENSOR_POSITIONS: torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default._schema,
        direct_calls.BLOCK_TENSOR_POSITIONS: torch.ops.cutlassfuse.conv3d_norm_activation.default._schema,
        direct_calls.NORM_TENSOR_POSITIONS: torch.ops.cutlassfuse.group_norm_activation.default._schema,
    }
    for positions, schema in schemas.items():
        tensors = tuple(i for i, a in enumerate(schema.arguments) if "Tensor" in str(a.type))
        assert positions == tensors


def route(arguments: tuple) -> str:
    return direct_calls.dispatcher_route(arguments, POSITIONS)


def test_plain_call_under_no_grad_goes_to_the_kernel():
    with torch.no_grad():
        assert route(block_arguments()) == "kernel"
    with torch.inference_mode():
        assert route(block_arguments()) == "kernel"


def test_grad_mode_goes_to_the_autograd_kernel_when_a_tensor_requires_grad():
    assert route(block_arguments()) == "autograd"  # the weight requires grad
    frozen = nn.Parameter(torch.randn(8, 4, 3, 3, 3), requires_grad=False)
    assert route(block_arguments(weight=frozen)) == "kernel"
    x = torch.randn(1, 4, 4, 4, 4, requires_grad=True)
    assert route(block_arguments(x=x, weight=frozen)) == "autograd"
    residual = torch.randn(1, 8, 4, 4, 4, requires_grad=True)
    assert route(block_arguments(weight=frozen, residual=residual)) == "autograd"


class _Subclass(torch.Tensor):
    pass


@pytest.mark.parametrize("which", ["input", "weight", "residual"])
def test_tensor_subclass_or_sparse_layout_takes_the_op(which):
    subclass = torch.randn(1, 4, 4, 4, 4).as_subclass(_Subclass)
    arguments = {"input": block_arguments(x=subclass),
                 "weight": block_arguments(weight=torch.randn(8, 4, 3, 3, 3).as_subclass(_Subclass)),
                 "residual": block_arguments(residual=torch.randn(1, 8, 4, 4, 4).as_subclass(_Subclass))}[which]
    with torch.no_grad():
        assert route(arguments) == "op"
        sparse = torch.randn(1, 4, 4, 4, 4).to_sparse()
        assert route(block_arguments(x=sparse)) == "op"
    assert route(arguments) == "op"  # in grad mode too


class _PassingDispatchMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _PassingFunctionMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("context", ["autocast", "dispatch_mode", "forward_ad", "function_mode", "profiler", "vmap"])
def test_what_the_dispatcher_does_on_the_way_takes_the_op(context):
    seen = []

    arguments = block_arguments()

    def check(x):
        seen.append(route((x, *arguments[1:])))
        return x

    x = torch.randn(1, 4, 4, 4, 4)
    with torch.no_grad():
        if context == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                check(x)
        elif context == "dispatch_mode":
            with _PassingDispatchMode():
                check(x)
        elif context == "forward_ad":
            with torch.autograd.forward_ad.dual_level():
                check(x)
        elif context == "function_mode":
            with _PassingFunctionMode():
                check(x)
        elif context == "profiler":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                check(x)
        else:
            torch.vmap(check)(x.unsqueeze(0))
        check(x)
    assert seen == ["op", "kernel"]


def test_tracing_and_compiling_take_the_op():
    frozen = nn.Parameter(torch.randn(8, 4, 3, 3, 3), requires_grad=False)

    def decide(x):
        return x + float(route(block_arguments(x=x, weight=frozen)) == "kernel")

    x = torch.zeros(1, 4, 4, 4, 4)
    assert decide(x).max() == 1
    assert torch.jit.trace(decide, (x,), check_trace=False)(x).max() == 0
    assert torch.compile(decide, backend="eager", fullgraph=True)(x).max() == 0
    assert torch.fx.symbolic_trace(decide)(x).max() == 0  # a Proxy is no tensor


def test_modules_on_the_cpu_take_the_op(monkeypatch):
    """On the CPU the op runs (its CPU kernel), whatever the grad mode: the CUDA and
    Autograd kernels are never called directly."""
    def refuse(*args):
        raise AssertionError("a kernel called directly for CPU tensors")

    for name in ("_OP", "_BLOCK", "_NORM"):
        kernels = getattr(direct_calls, name)
        monkeypatch.setattr(direct_calls, name, kernels._replace(cuda=refuse, autograd=refuse))
    block = cutlassfuse.Conv3dNormActivation(4, 8, 3, padding=1)
    norm = cutlassfuse.GroupNormActivation(2, 8)
    kb61 = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 8, 3, 2)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            y = block(torch.randn(1, 4, 4, 4, 4))
            assert norm(y).shape == y.shape
            assert kb61(y).shape == (1, 8, 6, 6, 6)
