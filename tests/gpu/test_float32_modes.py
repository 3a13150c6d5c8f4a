"""float32 modes on the GPU. "pytorch" (the default) runs the convolution as PyTorch does
under its TF32 switch, so the op stays within allclose(1e-4, 1e-4) of eager
ConvTranspose3d -> ReLU -> GroupNorm with TF32 allowed and with it disallowed. "tf32"
takes the fused path at TF32's precision (float16 tensor cores on operands scaled by
powers of two): its error against float64 is eager's own with TF32 allowed, to within
the summation order (tf32_bound), across float32's exponent range; it repeats bit for
bit, rounds its operands to nearest (not truncating them), and propagates NaN and Inf as
eager does. "bf16x3" takes the fused path too."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.bench import parse_shape
from cutlassfuse.ops import transposed_conv_output_size
from cutlassfuse.testing import KernelBenchModel, errors, make_inputs, poison_cuda_allocator, reference_float64
from test_fused_shapes import CASES, NAMED_CASES, case_id, case_inputs, output_numel  # tests/gpu

pytestmark = pytest.mark.gpu

TF32 = [pytest.param(True, id="tf32_allowed"), pytest.param(False, id="tf32_disallowed")]


def eager(call: dict) -> torch.Tensor:
    """The call through PyTorch's modules' functions, in the call's dtype."""
    y = F.relu(F.conv_transpose3d(call["input"], call["weight"], call["bias"], call["stride"], call["padding"],
                                  call["output_padding"], call["groups"], call["dilation"]))
    return F.group_norm(y, call["num_groups"], call["norm_weight"], call["norm_bias"], call["eps"])


def random_layers(count: int, seed: int = 0) -> list[dict]:
    """Layers with strides 1-2, kernels 1-4, padding, output padding, bias on and off,
    NCDHW and channels_last_3d input (make_inputs keywords)."""
    rng = random.Random(seed)
    layers = []
    while len(layers) < count:
        stride, kernel = rng.choice([1, 2]), rng.randint(1, 4)
        padding = rng.randint(0, min(2, kernel - 1))
        output_padding = rng.randint(0, stride - 1)
        size = tuple(rng.randint(3, 9) for _ in range(3))
        out = transposed_conv_output_size(size, (kernel,) * 3, (stride,) * 3, (padding,) * 3, (output_padding,) * 3,
                                          (1, 1, 1))
        if min(out) < 1:
            continue
        num_groups = rng.choice([1, 2, 4, 8])
        layers.append(dict(batch=rng.randint(1, 3), in_channels=rng.choice([3, 8, 16, 24]),
                           out_channels=num_groups * rng.randint(1, 4) * 2, size=size, kernel=kernel, stride=stride,
                           padding=padding, output_padding=output_padding, num_groups=num_groups,
                           bias=rng.random() < 0.5, channels_last=rng.random() < 0.5))
    return layers


@pytest.mark.parametrize("allow_tf32", TF32)
@pytest.mark.parametrize("index", range(24))
def test_pytorch_mode_matches_eager_on_random_layers(index, allow_tf32):
    call = make_inputs(**random_layers(24)[index], device="cuda", seed=index)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=allow_tf32):
        assert "float32 mode 'pytorch'" in cutlassfuse.explain(**call)
        torch.testing.assert_close(cutlassfuse.conv_transpose3d_relu_group_norm(**call), eager(call), atol=1e-4,
                                   rtol=1e-4)


def test_pytorch_mode_follows_the_tf32_switch_on_kernelbench_61():
    """KernelBench level2/61 in float32 (the benchmark shape kb61): within allclose(1e-4,
    1e-4) of eager in both settings, and as far from the other setting's result as eager
    is."""
    shape = parse_shape("kb61")
    torch.manual_seed(0)
    model = KernelBenchModel(shape.in_channels, shape.out_channels, shape.kernel, shape.groups).cuda()
    block = cutlassfuse.ConvTranspose3dReLUGroupNorm.from_modules(model.conv_transpose, model.group_norm)
    x = torch.rand(shape.batch, shape.in_channels, *shape.size, device="cuda")
    results = {}
    with torch.no_grad():
        for allow_tf32 in (True, False):
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=allow_tf32):
                ours, theirs = block(x), model(x)
                torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
                results[allow_tf32] = ours, theirs
    if not torch.equal(results[True][1], results[False][1]):  # eager's TF32 conv differs from strict
        assert not torch.equal(results[True][0], results[False][0])


def test_pytorch_mode_is_deterministic_when_pytorch_is():
    call = make_inputs(**random_layers(1, seed=5)[0], device="cuda", seed=5)
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        assert torch.equal(cutlassfuse.conv_transpose3d_relu_group_norm(**call),
                           cutlassfuse.conv_transpose3d_relu_group_norm(**call))


@pytest.mark.requires_sm90
def test_bf16x3_mode_takes_the_fused_path():
    x = torch.rand(2, 16, 6, 6, 6, device="cuda")
    w = 0.1 * torch.randn(16, 32, 3, 3, 3, device="cuda")
    with cutlassfuse.float32_mode("bf16x3"):
        assert cutlassfuse.explain(x, w, num_groups=8).startswith("fused_sm90: float32 as three bfloat16")
        out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=8)
    assert cutlassfuse.get_float32_mode() == "pytorch"
    torch.testing.assert_close(out, F.group_norm(F.relu(F.conv_transpose3d(x.double(), w.double())), 8).float(),
                               atol=2e-3, rtol=0)


def tf32_rounded(t: torch.Tensor, nearest: bool) -> torch.Tensor:
    """float32 `t` with its 13 low mantissa bits cleared: rounded to nearest TF32 (ties to
    even) or truncated (finite values)."""
    bits = t.contiguous().view(torch.int32)
    if nearest:
        bits = bits + 0xFFF + ((bits >> 13) & 1)
    return (bits & ~0x1FFF).view(torch.float32).view_as(t)


def eager_error(call: dict, reference: torch.Tensor, allow_tf32: bool) -> float:
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=allow_tf32):
        return errors(eager(call), reference).max_abs


def tf32_bound(call: dict, reference: torch.Tensor) -> float:
    """What the "tf32" mode's max abs error against float64 may reach: eager's own with
    TF32 allowed, where cuDNN ran the layer on TF32 (its error then well above its strict
    fp32 error), to within 1%: both round the operands alike, so their largest errors
    differ only by the float32 summation order (measured up to 0.3% either way). Where
    cuDNN chose a float32 algorithm anyway (small layers), the error that rounding the
    operands to nearest TF32 costs exact arithmetic, with 5% for the float32 summation.
    Plus one float32 ulp of the largest output."""
    ulp = torch.finfo(torch.float32).eps * reference.abs().max().item()
    theirs = eager_error(call, reference, allow_tf32=True)
    if theirs > 4 * eager_error(call, reference, allow_tf32=False):
        return 1.01 * theirs + ulp
    rounded = dict(call, input=tf32_rounded(call["input"], True), weight=tf32_rounded(call["weight"], True))
    return 1.05 * errors(reference_float64(**rounded), reference).max_abs + ulp


def run_tf32(call: dict, numel: int) -> torch.Tensor:
    """The op in float32 mode "tf32", into memory the allocator holds NaN in."""
    poison_cuda_allocator(8 * 4 * numel)
    with cutlassfuse.float32_mode("tf32"):
        out = cutlassfuse.conv_transpose3d_relu_group_norm(**call)
    torch.cuda.synchronize()
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    return out


@pytest.mark.requires_sm90
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_tf32_mode_is_as_accurate_as_eager_tf32(case: dict):
    """On the fused path's 60 edge-case and random layers (strides 1-3, sub-pixel phases,
    pixel-shuffle GEMMs, dilation, padding, bias and affine on and off, NCDHW and
    channels_last_3d): max abs error against float64 within tf32_bound (eager's own
    with TF32 allowed), and bit-for-bit repeats."""
    call = case_inputs(case, torch.float32)
    with cutlassfuse.float32_mode("tf32"):
        path = cutlassfuse.explain(**call)
    assert path.startswith("fused_sm90: float32 at TF32's precision"), path
    reference = reference_float64(**call)
    ours = run_tf32(call, output_numel(case))
    assert errors(ours, reference).max_abs <= tf32_bound(call, reference), errors(ours, reference)
    assert torch.equal(ours, run_tf32(call, output_numel(case))), "two runs differ"


@pytest.mark.requires_sm90
@pytest.mark.parametrize("config", backends.dgrad_configs())
@pytest.mark.parametrize("case", NAMED_CASES[:12], ids=case_id)
def test_tf32_mode_runs_every_config(case: dict, config: str):
    call = case_inputs(case, torch.float32)
    with cutlassfuse.float32_mode("tf32"), backends.flags(dgrad_config=config):
        path = cutlassfuse.explain(**call)
        assert config in path, path
        ours = run_tf32(call, output_numel(case))
    reference = reference_float64(**call)
    assert errors(ours, reference).max_abs <= tf32_bound(call, reference)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("stride", [1, 2])
def test_tf32_mode_rounds_operands_to_nearest(stride: int):
    """The op lands on the float64 result of its operands rounded to nearest TF32, not of
    them truncated: uniform positive inputs make truncation's bias add up over the
    27 * 64 terms of each output."""
    call = make_inputs(batch=2, in_channels=64, out_channels=64, size=6, kernel=3, stride=stride, padding=1,
                       num_groups=8, device="cuda", seed=stride)
    call["input"] = torch.rand_like(call["input"]) + 1
    call["weight"] = torch.rand_like(call["weight"]) + 1
    ours = run_tf32(call, 2 * 64 * 13**3)

    def reference(nearest: bool) -> torch.Tensor:
        rounded = dict(call, input=tf32_rounded(call["input"], nearest), weight=tf32_rounded(call["weight"], nearest))
        return reference_float64(**rounded)

    to_nearest, to_truncated = errors(ours, reference(True)).max_abs, errors(ours, reference(False)).max_abs
    assert to_nearest * 10 < to_truncated, (to_nearest, to_truncated)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("input_exponent, weight_exponent, spread",
                         [(60, -40, 0), (-30, 40, 0), (100, -90, 0), (0, 0, -40)],
                         ids=["large_input", "small_input", "near_float32_limits", "input_spanning_2^40"])
def test_tf32_mode_keeps_tf32_precision_across_float32_range(input_exponent, weight_exponent, spread):
    """float16 has TF32's significand but 5 exponent bits: each operand is scaled by a
    power of two before its rounding. Operands far outside float16's range (2^60, 2^-30,
    2^100), and an input whose channels span 2^40 (the small ones below float16's normal
    range after scaling), land within tf32_bound all the same."""
    call = make_inputs(batch=2, in_channels=64, out_channels=64, size=6, kernel=3, stride=2, padding=1,
                       num_groups=8, device="cuda", seed=11)
    call["input"] = call["input"] * 2.0**input_exponent
    call["input"][:, 32:] *= 2.0**spread
    call["weight"] = call["weight"] * 2.0**weight_exponent
    call["bias"] = None
    ours = run_tf32(call, 2 * 64 * 11**3)
    reference = reference_float64(**call)
    assert errors(ours, reference).max_abs <= tf32_bound(call, reference), errors(ours, reference)


@pytest.mark.requires_sm90
@pytest.mark.parametrize("stride", [1, 2], ids=["unit_stride", "sub_pixel_phases"])
@pytest.mark.parametrize("special", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_tf32_mode_propagates_nan_and_inf_like_eager(stride, special):
    """A non-finite input value spoils exactly the (sample, group) pairs it reaches, and
    takes no part in the scaling of the other values."""
    call = make_inputs(batch=2, in_channels=64, out_channels=64, size=6, kernel=3, stride=stride, padding=1,
                       num_groups=8, device="cuda", seed=12)
    call["input"][1, 3, 2, 2, 2] = special
    with cutlassfuse.float32_mode("tf32"):
        out = cutlassfuse.conv_transpose3d_relu_group_norm(**call)
    expected = reference_float64(**call)
    assert torch.equal(out.isnan(), expected.isnan())
    assert out.isnan().any() and not out[0].isnan().any(), "only sample 1 holds the special value"
    clean = dict(call, input=call["input"][:1])
    assert errors(out[:1], expected[:1]).max_abs <= tf32_bound(clean, reference_float64(**clean))
