"""The backward on the GPU: every gradient of 36 layers (sub-pixel phases, kernel ==
stride, unreached pixels, NCDHW and channels_last_3d, with and without bias and affine,
gamma with zeros and negatives) against float64, no further from it than eager's own
gradients in the same dtype (1.25x, plus a floor of the dtype's rounding of the
gradient); gradients repeat bit for bit; the backward kernels write every element."""

import random

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import errors, make_inputs, op_arguments, poison_cuda_allocator

pytestmark = pytest.mark.gpu

TENSORS = ("input", "weight", "bias", "norm_weight", "norm_bias")
# A gradient's max abs may exceed eager's by one rounding of the gradient itself.
FLOOR = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float32: 2.0**-23}


def layers() -> list[dict]:
    rng = random.Random(31)
    cases = []
    for i in range(36):
        kernel, stride = rng.choice([(3, 1), (3, 2), (2, 2), (4, 2), (1, 1), (1, 2), (3, 3)])
        padding = rng.choice([0, 1]) if kernel > 1 else 0
        output_padding = rng.choice([0, stride - 1]) if stride > 1 else 0
        out_channels = rng.choice([16, 32, 64, 128])
        cases.append(dict(batch=rng.choice([1, 2, 3]), in_channels=rng.choice([8, 16, 32, 64]),
                          out_channels=out_channels, size=tuple(rng.randint(2, 7) for _ in range(3)),
                          kernel=kernel, stride=stride, padding=padding, output_padding=output_padding,
                          num_groups=rng.choice([g for g in (1, 2, 4, 8) if out_channels % g == 0]),
                          bias=i % 3 != 0, affine=i % 4 != 1, channels_last=i % 2 == 0, seed=i))
    # The pixel-shuffle GEMM's layers (kernel == stride), whose grad-mode forward keeps the
    # activation in space-to-depth order on the fused path.
    for channels_last in (False, True):
        cases.append(dict(batch=2, in_channels=32, out_channels=32, size=(3, 4, 5), kernel=2, stride=2, padding=0,
                          output_padding=0, num_groups=8, bias=True, affine=True, channels_last=channels_last,
                          seed=len(cases)))
    return cases


LAYERS = layers()


def gradients(a: dict, fn, grad: torch.Tensor) -> dict:
    a = {k: v.detach().clone().requires_grad_() if k in TENSORS and v is not None else v for k, v in a.items()}
    fn(a).backward(grad.to(a["input"].dtype))
    return {k: a[k].grad for k in TENSORS if a[k] is not None}


def eager(a: dict) -> torch.Tensor:
    y = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"])
    return F.group_norm(F.relu(y), a["num_groups"], a["norm_weight"], a["norm_bias"], a["eps"])


def ours(a: dict) -> torch.Tensor:
    return cutlassfuse.conv_transpose3d_relu_group_norm(**a)


def with_signed_gamma(a: dict) -> dict:
    """gamma with zeros and negatives, as trained layers have."""
    if a["norm_weight"] is not None:
        gamma = a["norm_weight"].detach().clone()
        gamma[::3] = 0
        gamma[1::3] *= -1
        a["norm_weight"] = gamma
    return a


def check_against_float64(layer: dict, dtype: torch.dtype) -> None:
    a = with_signed_gamma(make_inputs(**layer, dtype=dtype, device="cuda"))
    reference = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    # Drawn from the layer's own seed: the same gradient whichever tests ran before.
    generator = torch.Generator(device="cuda").manual_seed(layer["seed"])
    grad = torch.randn(eager(reference).shape, device="cuda", dtype=torch.float64, generator=generator)
    exact = gradients(reference, eager, grad)
    mine, theirs = gradients(a, ours, grad), gradients(a, eager, grad)
    for name, expected in exact.items():
        error, eager_error = errors(mine[name], expected).max_abs, errors(theirs[name], expected).max_abs
        floor = FLOOR[dtype] * expected.abs().max().item()
        assert error <= 1.25 * eager_error + floor, f"{name}: {error:.3e} against eager's {eager_error:.3e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["float16", "bfloat16",
                                                                                     "float32"])
@pytest.mark.parametrize("layer", LAYERS, ids=range(len(LAYERS)))
def test_gradients_no_further_from_float64_than_eager(layer: dict, dtype: torch.dtype):
    """float32 in float32 mode "pytorch" keeps the convolution's output, from which the
    backward recomputes the activation."""
    check_against_float64(layer, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("layer", LAYERS, ids=range(len(LAYERS)))
def test_cutlass_convolution_gradients_no_further_from_float64_than_eager(layer: dict, dtype: torch.dtype):
    with backends.flags(conv_gradients="cutlass"):
        check_against_float64(layer, dtype)


STRIDED_WIDE = dict(in_channels=256, out_channels=128, kernel=4, stride=2, padding=1)  # 128 weight-gradient tiles
STRIDED_NARROW = dict(in_channels=128, out_channels=64, kernel=3, stride=2, padding=1, output_padding=1)
UNIT_STRIDE = dict(in_channels=128, out_channels=64, kernel=3)


@pytest.mark.parametrize("choice, layer, kernels", [
    ("aten", STRIDED_WIDE, 0),
    ("auto", STRIDED_WIDE, 2),     # both gradients preferred
    ("auto", STRIDED_NARROW, 1),   # the input gradient only: too few weight-gradient tiles
    ("auto", UNIT_STRIDE, 0),
    ("cutlass", UNIT_STRIDE, 2),
], ids=["aten", "auto_both", "auto_input_only", "auto_unit_stride", "cutlass"])
def test_convolution_gradients_run_where_chosen(choice: str, layer: dict, kernels: int):
    """How many of a float16 layer's two convolution gradients run this project's CUTLASS
    kernels (CUTLASS's ConvUniversal kernel layer) under each conv_gradients choice."""
    a = make_inputs(batch=2, size=(4, 4, 4), num_groups=8, dtype=torch.float16, device="cuda", requires_grad=True,
                    **layer)
    out = ours(a)
    grad = torch.randn_like(out)
    with backends.flags(conv_gradients=choice), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        out.backward(grad)
        torch.cuda.synchronize()
    names = [e.name for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("ConvUniversal" in n for n in names) == kernels, names


def test_dynamic_shapes_under_compile_keep_one_graph():
    """torch.compile(dynamic=True) of a training step on a strided float16 layer that
    "auto" gives to the CUTLASS kernels: a second batch size reuses the graph (choosing
    the kernels guards on no size), and the gradients match the uncompiled module's."""
    torch.manual_seed(0)
    layer = cutlassfuse.ConvTranspose3dReLUGroupNorm(256, 128, 4, 8, stride=2, padding=1).cuda().half()

    def step(x, grad):
        return torch.autograd.grad(layer(x), [x, layer.conv_transpose.weight], grad)

    compiled = torch.compile(step, dynamic=True, backend="aot_eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        for batch in (2, 3):
            x = torch.randn(batch, 256, 4, 4, 4, device="cuda", dtype=torch.float16, requires_grad=True)
            grad = torch.randn(batch, 128, 8, 8, 8, device="cuda", dtype=torch.float16)
            for got, want in zip(compiled(x, grad), step(x, grad), strict=True):
                assert (got.float() - want.float()).abs().max() <= 1e-2 * want.float().abs().max()


@pytest.mark.parametrize("layer", LAYERS[:6], ids=range(6))
def test_gradients_repeat_bit_for_bit(layer: dict):
    a = with_signed_gamma(make_inputs(**layer, dtype=torch.float16, device="cuda"))
    grad = torch.randn(ours(a).shape, device="cuda", dtype=torch.float16)
    first, second = gradients(a, ours, grad), gradients(a, ours, grad)
    for name in first:
        assert torch.equal(first[name], second[name]), name


def grad_in_layout(shape: torch.Size, layout: str) -> torch.Tensor:
    if layout == "expanded":
        return torch.randn(1, shape[1], 1, 1, 1, device="cuda", dtype=torch.float16).expand(shape)
    grad = torch.randn(shape, device="cuda", dtype=torch.float16)
    return grad.contiguous(memory_format=torch.channels_last_3d) if layout == "channels_last" else grad


# 64 channels take the kernels' 16-byte accesses, 12 their one-element ones.
@pytest.mark.parametrize("channels,groups", [(64, 8), (12, 4)], ids=["vector", "scalar"])
@pytest.mark.parametrize("layout", ["ncdhw", "channels_last", "expanded"])
def test_backward_kernels_write_every_element(channels: int, groups: int, layout: str):
    a = make_inputs(batch=2, in_channels=32, out_channels=channels, size=(5, 6, 7), kernel=3, padding=1,
                    num_groups=groups, dtype=torch.float16, device="cuda", channels_last=True)
    _, activation, mean, rstd = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm_for_backward(
        a["input"], a["weight"], a["bias"], a["norm_weight"], a["norm_bias"], a["num_groups"], a["eps"],
        [1] * 3, [1] * 3, [0] * 3, 1, [1] * 3)
    grad = grad_in_layout(activation.shape, layout)
    poison_cuda_allocator(4 * activation.numel() * activation.element_size())
    outputs = torch.ops.cutlassfuse.relu_group_norm_backward(grad, activation, mean, rstd, a["norm_weight"],
                                                             a["num_groups"])
    for t in outputs:
        assert torch.isfinite(t).all()
    expected = torch.ops.cutlassfuse.relu_group_norm_backward(grad.cpu().float(), activation.cpu().float(),
                                                              mean.cpu(), rstd.cpu(), a["norm_weight"].cpu(),
                                                              a["num_groups"])
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got.float().cpu(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels", [16, 12])
@pytest.mark.parametrize("offset", [0, 1])
def test_convert_memory_format_copies_exactly(dtype: torch.dtype, channels: int, offset: int):
    """Both directions, bit for bit, through the transposes (16-bit types, channels % 8 == 0,
    aligned) and ATen's copy elsewhere (a one-element offset leaves the rows unaligned)."""
    storage = torch.randn(offset + 3 * channels * 5 * 6 * 7, device="cuda").to(dtype)
    ncdhw = storage[offset:].view(3, channels, 5, 6, 7)
    to_last = torch.ops.cutlassfuse.convert_memory_format(ncdhw, True)
    assert to_last.is_contiguous(memory_format=torch.channels_last_3d) and torch.equal(to_last, ncdhw)
    back = torch.ops.cutlassfuse.convert_memory_format(to_last, False)
    assert back.is_contiguous() and torch.equal(back, ncdhw)


def test_backward_runs_the_vector_kernels_and_transposes():
    """An NCDHW layer in float16: dy and the input go channels-last, and the input gradient
    back, through the tiled transposes; the ReLU + GroupNorm backward takes 16-byte accesses."""
    a = make_inputs(batch=2, in_channels=32, out_channels=64, size=(6, 6, 6), kernel=3, num_groups=8,
                    dtype=torch.float16, device="cuda")
    a["input"].requires_grad_()
    out = ours(a)
    grad = torch.randn_like(out)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        out.backward(grad)
        torch.cuda.synchronize()
    names = " ".join(e.name for e in profile.events())
    for kernel in ("ncdhw_to_ndhwc_kernel", "ndhwc_to_ncdhw_kernel", "backward_sums_kernel<__half, 8, false>",
                   "backward_grad_kernel<__half, 8, false>"):
        assert kernel in names, kernel
    assert a["input"].grad.is_contiguous()


@pytest.mark.parametrize("out_channels", [32, 12], ids=["vectors", "elements"])
def test_backward_reads_the_space_to_depth_activation_in_place(out_channels: int):
    """The activation a grad-mode forward keeps in the pixel-shuffle GEMM's order gives
    the same gradients bit for bit as the same activation in pixel order, read where it
    lies (the kernels' shuffled variants; no reordering copy)."""
    a = make_inputs(batch=2, in_channels=32, out_channels=out_channels, size=(3, 4, 5), kernel=2, stride=2,
                    num_groups=4, dtype=torch.float16, device="cuda", channels_last=True, seed=5)
    arguments = op_arguments(a)
    _, pixels, mean, rstd = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm_for_backward(*arguments)
    _, blocked, _, _ = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm_for_backward(*arguments, False, True)
    assert blocked.dim() == 8 and blocked.is_contiguous()
    grad = torch.randn(pixels.shape, device="cuda", dtype=torch.float16).contiguous(
        memory_format=torch.channels_last_3d)
    backward = torch.ops.cutlassfuse.relu_group_norm_backward
    expected = backward(grad, pixels, mean, rstd, a["norm_weight"], a["num_groups"])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        got = backward(grad, blocked, mean, rstd, a["norm_weight"], a["num_groups"])
        torch.cuda.synchronize()
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    kernels = [e.name for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("backward_sums_kernel<__half" in k and "true>" in k for k in kernels), kernels
    assert any("backward_grad_kernel<__half" in k and "true>" in k for k in kernels), kernels
    assert not any("copy" in k.lower() or "elementwise" in k.lower() for k in kernels), kernels
