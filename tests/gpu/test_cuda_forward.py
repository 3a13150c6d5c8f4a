"""The CUDA op against float64, on shapes the fused sm90 path takes and on the ones it
hands to the reference path. Run on the device: scripts/device_iteration.sh."""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.bench import DEFAULT_SHAPES
from cutlassfuse.testing import (RELATIVE_TOLERANCE, errors, fused_path_expected, make_inputs, op_arguments,
                                 packed_operands, poison_cuda_allocator, reference_float64)

# float32 is held to float64 and bitwise repeatable: PyTorch's strict, deterministic setting.
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    in_channels: int
    out_channels: int
    size: tuple[int, int, int]
    kernel: int
    num_groups: int
    stride: int = 1
    padding: int = 0
    output_padding: int = 0
    dilation: int = 1
    bias: bool = False
    affine: bool = True
    channels_last: bool = False
    fused: bool = True  # the sm90 fused path must take it (on an sm_90 GPU)


# The benchmark layers (cutlassfuse.bench.DEFAULT_SHAPES), then edge cases.
CASES = [Case(shape.name, **shape.make_inputs_keywords()) for shape in DEFAULT_SHAPES] + [
    Case("unet_k2s2_bias_channels_last", 2, 64, 32, (6, 7, 5), 2, 4, stride=2, bias=True, channels_last=True),
    Case("kernel1_stride2_bias", 2, 16, 32, (5, 6, 7), 1, 4, stride=2, output_padding=1, bias=True),
    Case("kernel2_stride3_padding1", 2, 32, 48, (4, 5, 6), 2, 6, stride=3, padding=1, bias=True,
         channels_last=True),
    Case("bias_group_per_channel", 1, 32, 16, (5, 6, 7), 3, 16, padding=1, bias=True),
    Case("pointwise_one_group", 2, 16, 64, (7, 5, 3), 1, 1),
    Case("dilated_channels_last", 3, 24, 40, (4, 4, 4), 2, 5, dilation=2, bias=True, channels_last=True),
    Case("padded_256_channels", 2, 64, 256, (6, 6, 6), 3, 32, padding=1),
    Case("kernel5_padding2", 4, 8, 24, (3, 3, 3), 5, 3, padding=2),
    Case("1024_channels", 1, 128, 1024, (2, 2, 2), 3, 64),
    Case("single_voxel", 5, 16, 16, (1, 1, 1), 1, 2),
    Case("no_affine_channels_last", 2, 32, 64, (9, 9, 9), 3, 4, affine=False, channels_last=True),
    Case("odd_channels", 2, 3, 12, (5, 5, 5), 3, 4, fused=False),
]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
FLOAT32_MAX_ABS = 1e-4  # strict fp32 (TF32 off); a TF32 convolution lands ~3e-3 away


def case_inputs(case: Case, dtype: torch.dtype) -> dict:
    shape = {k: v for k, v in asdict(case).items() if k not in ("name", "fused")}
    return make_inputs(**shape, dtype=dtype, device="cuda", seed=zlib.crc32(f"{case.name}/{dtype}".encode()))


def eager(inputs: dict) -> torch.Tensor:
    y = F.conv_transpose3d(inputs["input"], inputs["weight"], inputs["bias"], inputs["stride"], inputs["padding"],
                           inputs["output_padding"], 1, inputs["dilation"])
    return F.group_norm(F.relu(y), inputs["num_groups"], inputs["norm_weight"], inputs["norm_bias"])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_float64(case: Case, dtype: torch.dtype):
    inputs = case_inputs(case, dtype)
    path = cutlassfuse.explain(**inputs)
    if case.fused and fused_path_expected() and dtype != torch.float32:
        assert path.startswith("fused_sm90"), path

    expected_like = eager(inputs)  # shape and dtype of PyTorch's result
    poison_cuda_allocator(4 * expected_like.numel() * expected_like.element_size())
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    torch.cuda.synchronize()

    assert out.shape == expected_like.shape and out.dtype == dtype
    # The op's rule on every device (the CPU composite's and cuDNN's): channels-last in,
    # channels-last out. PyTorch's CUDA GroupNorm (2.11) returns contiguous instead.
    memory_format = torch.channels_last_3d if case.channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=memory_format), f"output is not {memory_format}"
    assert torch.isfinite(out).all(), "unwritten (poisoned) or non-finite output elements"
    err = errors(out, reference_float64(**inputs))
    if dtype == torch.float32:
        assert err.max_abs <= FLOAT32_MAX_ABS, f"{case.name} {dtype} via {path}: {err}"
    else:
        assert err.relative <= RELATIVE_TOLERANCE[dtype], f"{case.name} {dtype} via {path}: {err}"

    again = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    assert torch.equal(out, again), "two runs on the same inputs differ"


def test_calls_of_one_shape_follow_their_own_tensors():
    """The ping-pong kernel's parameters are kept per (problem, tensor addresses): calls of one strided shape
    alternating two inputs and weights each get their own result, and a repeated call its bitwise twin."""
    torch.manual_seed(0)
    xs = [torch.rand(2, 32, 4, 5, 6, device="cuda", dtype=torch.half) for _ in range(2)]
    ws = [(torch.randn(32, 48, 3, 3, 3, device="cuda") * 0.05).half() for _ in range(2)]
    args = dict(stride=2, padding=1, output_padding=1, num_groups=6)
    outs = [cutlassfuse.conv_transpose3d_relu_group_norm(xs[i % 2], ws[i % 2], **args) for i in range(4)]
    for i, out in enumerate(outs):
        expected = reference_float64(xs[i % 2], ws[i % 2], **args)
        assert errors(out, expected).relative <= RELATIVE_TOLERANCE[torch.float16]
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])
    assert not torch.equal(outs[0], outs[1])


def test_module_repacks_weight_when_it_changes():
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(16, 32, 3, 4, bias=True).cuda().half()
    x = torch.rand(2, 16, 6, 6, 6, device="cuda", dtype=torch.half)
    first = module._conv_operands()[2]
    assert module._conv_operands()[2] is first, "an unchanged weight must reuse its packed copy"

    def check():
        conv, norm = module.conv_transpose, module.group_norm
        expected = reference_float64(x, conv.weight, conv.bias, num_groups=4, norm_weight=norm.weight,
                                     norm_bias=norm.bias)
        assert errors(module(x), expected).relative <= RELATIVE_TOLERANCE[torch.float16]

    check()
    with torch.no_grad():
        module.conv_transpose.weight.mul_(-1.5)  # in place: same storage, new version
    assert module._conv_operands()[2] is not first
    check()
    module.conv_transpose.weight = torch.nn.Parameter(torch.randn_like(module.conv_transpose.weight) * 0.05)
    check()


def test_module_repacks_after_a_dtype_round_trip():
    """.bfloat16().half() rounds the weights, and the caching allocator can hand the new half weight the old one's
    block with the old version: the module must use the new values (bitwise the functional op's result)."""
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(16, 32, 3, 4, bias=True).cuda().half()
    x = torch.rand(2, 16, 6, 6, 6, device="cuda", dtype=torch.half)
    with torch.no_grad():
        before = module(x)
        module.bfloat16().half()
        conv, norm = module.conv_transpose, module.group_norm
        expected = cutlassfuse.conv_transpose3d_relu_group_norm(x, conv.weight, conv.bias, num_groups=4,
                                                                norm_weight=norm.weight, norm_bias=norm.bias)
        assert not torch.equal(before, expected), "the round trip must change the weights for this test to mean much"
        assert torch.equal(module(x), expected)


def test_module_passes_the_repeated_bias_of_kernel_equal_stride_layers():
    """A kernel == stride layer's GEMM reads the bias once per output block: the module caches the repeated
    copy (re-made when the bias changes) and the result is bitwise that of the op repeating it itself."""
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 2, 8, bias=True, stride=2).cuda().half()
    x = torch.rand(2, 32, 4, 6, 8, device="cuda", dtype=torch.half)
    first = module._conv_operands()[3]
    assert first is not None and module._conv_operands()[3] is first
    assert torch.equal(first, module.conv_transpose.bias.detach().repeat(8))

    def functional():
        conv, norm = module.conv_transpose, module.group_norm
        return cutlassfuse.conv_transpose3d_relu_group_norm(x, conv.weight, conv.bias, 2, num_groups=8,
                                                            norm_weight=norm.weight, norm_bias=norm.bias)

    with torch.no_grad():
        assert torch.equal(module(x), functional())
        module.conv_transpose.bias.add_(0.5)  # in place: same storage, new version
        assert module._conv_operands()[3] is not first
        assert torch.equal(module(x), functional())


def _optimizer_step(module, **options):
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    # eps within float16's range: Adam's default 1e-8 rounds to 0 there, and a second moment
    # that underflows too would divide 0 by 0.
    torch.optim.Adam(module.parameters(), lr=0.1, eps=1e-3, **options).step()


def _load_other_state_dict(module, **options):
    torch.manual_seed(1)
    other = cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 2, 8, bias=True, stride=2).cuda().half()
    module.load_state_dict(other.state_dict(), **options)


PARAMETER_UPDATES = {
    "in_place": lambda m: (m.conv_transpose.weight.mul_(-1.5), m.conv_transpose.bias.add_(0.5)),
    "nn_init": lambda m: (torch.nn.init.normal_(m.conv_transpose.weight, std=0.05),
                          torch.nn.init.normal_(m.conv_transpose.bias)),
    "adam_step": _optimizer_step,
    "fused_adam_step": lambda m: _optimizer_step(m, fused=True),  # writes without bumping versions
    "load_state_dict": _load_other_state_dict,
    "load_state_dict_assign": lambda m: _load_other_state_dict(m, assign=True),
}


@pytest.mark.parametrize("update", PARAMETER_UPDATES)
def test_module_follows_parameter_updates_between_calls(update):
    """Each way PyTorch writes parameters, between two calls of a kernel == stride layer
    (the fused kernels read both packed copies): the second call computes with the new
    values, bitwise the functional op's result on them."""
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 2, 8, bias=True, stride=2).cuda().half()
    x = torch.rand(2, 32, 4, 6, 8, device="cuda", dtype=torch.half)
    with torch.no_grad():
        before = module(x)
        PARAMETER_UPDATES[update](module)
        conv, norm = module.conv_transpose, module.group_norm
        expected = cutlassfuse.conv_transpose3d_relu_group_norm(x, conv.weight, conv.bias, 2, num_groups=8,
                                                                norm_weight=norm.weight, norm_bias=norm.bias)
        assert not torch.equal(before, expected), "the update must change the result for this test to mean much"
        assert torch.equal(module(x), expected)


def test_module_follows_parameters_refilled_in_a_shared_buffer():
    """Parameters that view one flat buffer, as FSDP's gathered ones do, rewritten there
    without a version bump between two calls: the second call computes with the new values."""
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 2, 8, bias=True, stride=2).cuda().half()
    conv, norm = module.conv_transpose, module.group_norm
    flat = torch.cat([conv.weight.detach().flatten(), conv.bias.detach()])
    conv.weight = torch.nn.Parameter(flat[:conv.weight.numel()].view_as(conv.weight))
    conv.bias = torch.nn.Parameter(flat[conv.weight.numel():])
    x = torch.rand(2, 32, 4, 6, 8, device="cuda", dtype=torch.half)
    with torch.no_grad():
        before = module(x)
        flat.data.mul_(-1.5)  # through .data: no version bump
        expected = cutlassfuse.conv_transpose3d_relu_group_norm(x, conv.weight, conv.bias, 2, num_groups=8,
                                                                norm_weight=norm.weight, norm_bias=norm.bias)
        assert not torch.equal(before, expected)
        assert torch.equal(module(x), expected)


@pytest.mark.parametrize("stride", [1, 2], ids=["unit_stride", "sub_pixel_phases"])
@pytest.mark.parametrize("special", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_and_inf_propagate_like_eager(stride, special):
    """A non-finite input value spoils exactly the (sample, group) pairs it reaches, as in
    eager: ReLU keeps NaN, GroupNorm of a group holding NaN or Inf is NaN."""
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.rand(2, 16, 5, 6, 7, generator=g, device="cuda", dtype=torch.float16)
    w = (torch.randn(16, 32, 3, 3, 3, generator=g, device="cuda") * 0.05).to(torch.float16)
    x[1, 3, 2, 2, 2] = special
    args = dict(stride=stride, padding=1, num_groups=4)
    assert cutlassfuse.explain(x, w, **args).startswith("fused_sm90") or not fused_path_expected()
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, **args)
    expected = reference_float64(x, w, **args)
    assert torch.equal(out.isnan(), expected.isnan())
    assert out.isnan().any() and not out[0].isnan().any(), "only sample 1 holds the special value"


def test_misaligned_views_take_a_path_that_reads_them():
    """A channels-last view at a 2-byte offset: TMA cannot read it at its address, so the call must not take the
    fused kernels' direct read (the TMA descriptors' own alignment checks are compiled out)."""
    g = torch.Generator(device="cuda").manual_seed(3)
    flat = torch.rand(2 * 16 * 5 * 6 * 7 + 1, generator=g, device="cuda", dtype=torch.half)
    x = flat[1:].view(2, 5, 6, 7, 16).permute(0, 4, 1, 2, 3)  # channels_last_3d, 2-byte aligned
    w = (torch.randn(16, 32, 3, 3, 3, generator=g, device="cuda") * 0.1).half()
    assert x.is_contiguous(memory_format=torch.channels_last_3d) and x.data_ptr() % 16 != 0
    assert not cutlassfuse.explain(x, w, num_groups=4).startswith("fused_sm90")
    out = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=4)
    assert errors(out, reference_float64(x, w, num_groups=4)).relative <= RELATIVE_TOLERANCE[torch.float16]



@pytest.mark.requires_sm90
@pytest.mark.parametrize("kernel,stride", [(3, 1), (3, 2), (2, 2)],
                         ids=["unit_stride", "sub_pixel_phases", "pixel_shuffle_gemm"])
def test_fused_path_reads_the_packed_operands(kernel, stride):
    """The module passes the op its packed weight and bias (packed_operands) to skip
    re-packing them on every call: with them the result is bitwise the call's without
    them, and the fused kernels read the packed copies in place of the weight (and, in
    kernel == stride layers, the bias): copies packed from other tensors give those
    tensors' result, which is why they are the module's private cache, re-packed when its
    parameters change, and not arguments of the functional op."""
    inputs = make_inputs(batch=2, in_channels=32, out_channels=64, size=(4, 5, 6), kernel=kernel, stride=stride,
                         num_groups=8, dtype=torch.float16, device="cuda", seed=kernel * 10 + stride)
    assert cutlassfuse.explain(**inputs).startswith("fused_sm90")
    other = make_inputs(batch=2, in_channels=32, out_channels=64, size=(4, 5, 6), kernel=kernel, stride=stride,
                        num_groups=8, dtype=torch.float16, device="cuda", seed=kernel * 10 + stride + 1)

    def with_packed(source: dict) -> torch.Tensor:
        return torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm(
            *op_arguments(dict(inputs, **packed_operands(source))))

    plain = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    assert torch.equal(with_packed(inputs), plain)
    bias_read = other["bias"] if kernel == stride else inputs["bias"]
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(**dict(inputs, weight=other["weight"], bias=bias_read))
    assert not torch.equal(expected, plain)
    assert torch.equal(with_packed(other), expected)
