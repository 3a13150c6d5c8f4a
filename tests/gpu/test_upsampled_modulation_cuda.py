"""On the GPU: torch.ops.cutlassfuse.upsampled_modulation's pass against float64 (no further
from it than PyTorch's ops in the same type), every output element written, deterministic,
for channels-last tensors whose channels are a multiple of 8; other calls take ATen's ops;
calls that autograd records the pass with the formulas' derivatives; CogVideoX's fused
decoder, channels-last, modulates with it."""

import pytest
import torch

from cutlassfuse.testing import poison_cuda_allocator
from test_replication_pad_cuda import kernel_names  # tests/gpu
from test_upsampled_modulation import ACTIVATIONS, GRIDS, MODULATION, upsampled  # tests/

pytestmark = pytest.mark.gpu

CL = torch.channels_last_3d
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
KERNEL = "upsampled_modulation_kernel"
EPS = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def case(grid, dtype, memory_format=CL, channels=64):
    size, small, causal = GRIDS[grid]
    g = torch.Generator(device="cuda").manual_seed(0)
    tensors = [torch.randn(2, channels, *s, device="cuda", generator=g, dtype=torch.float64)
               .contiguous(memory_format=memory_format) for s in (size, small, small)]
    return tensors, causal


def formula(x, scale, shift, causal, activation):
    """PyTorch's ops as a model writes them: upsample, multiply, add, activate."""
    parameter, act = ACTIVATIONS[activation]
    size = x.shape[2:]
    return act(x * upsampled(scale, size, causal) + upsampled(shift, size, causal))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("activation", ["identity", "silu", "leaky_relu", "gelu_tanh"])
@pytest.mark.parametrize("grid", list(GRIDS))
def test_pass_matches_float64(grid, activation, dtype):
    tensors64, causal = case(grid, dtype)
    expected = formula(*tensors64, causal, activation)
    x, scale, shift = (t.to(dtype) for t in tensors64)
    parameter = ACTIVATIONS[activation][0]
    poison_cuda_allocator(4 * x.numel() * x.element_size())
    with torch.no_grad():
        names = kernel_names(lambda: MODULATION(x, scale, shift, causal, activation, parameter))
        out = MODULATION(x, scale, shift, causal, activation, parameter)
        again = MODULATION(x, scale, shift, causal, activation, parameter)
        eager = formula(x, scale, shift, causal, activation)
    assert any(KERNEL in n for n in names), names
    assert out.is_contiguous(memory_format=CL) and not out.isnan().any()
    assert torch.equal(out, again)
    ours = (out.double() - expected).abs().max().item()
    theirs = (eager.double() - expected).abs().max().item()
    # One rounding fewer than PyTorch's ops; an ulp of slack for the activations' float32 math.
    assert ours <= theirs + EPS[dtype] * expected.abs().max().item(), (ours, theirs)


@pytest.mark.parametrize(("memory_format", "channels"), [(torch.contiguous_format, 64), (CL, 12)],
                         ids=["ncdhw", "channels_not_a_multiple_of_8"])
def test_other_calls_take_atens_ops(memory_format, channels):
    (x, scale, shift), causal = case("causal", torch.float32, memory_format, channels)
    x, scale, shift = x.float(), scale.float(), shift.float()
    with torch.no_grad():
        names = kernel_names(lambda: MODULATION(x, scale, shift, causal, "silu", 0.0))
        out = MODULATION(x, scale, shift, causal, "silu", 0.0)
    assert not any(KERNEL in n for n in names), names
    torch.testing.assert_close(out, formula(x, scale, shift, causal, "silu"))
    assert out.is_contiguous(memory_format=memory_format)


def test_recorded_calls_run_the_pass_with_the_formulas_gradients():
    tensors64, causal = case("causal", torch.float32)
    ours = [t.float().requires_grad_() for t in tensors64]
    theirs = [t.float().detach().requires_grad_() for t in tensors64]
    names = kernel_names(lambda: MODULATION(*ours, causal, "silu", 0.0))
    assert any(KERNEL in n for n in names), names
    out = MODULATION(*ours, causal, "silu", 0.0)
    assert out.grad_fn.name() == "CutlassfuseUpsampledModulationBackward"
    grad = torch.randn_like(out)
    out.backward(grad)
    formula(*theirs, causal, "silu").backward(grad)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-4)
