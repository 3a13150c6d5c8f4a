"""On the GPU: torch.ops.cutlassfuse.upsample_nearest3d's copy kernels give ATen's nearest
upsampling bit for bit (every output element written, the input's layout) in both layouts
and every type ATen's CUDA kernel upsamples; calls outside their scope take ATen's, calls
that autograd records the kernels with ATen's derivative; KernelMode sends ATen's pads and upsampling to the copy
kernels, and fuse() runs a video decoder's untraced upsampling blocks under it where that pays."""

import copy

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse.kernel_mode import KernelMode
from cutlassfuse.testing import poison_cuda_allocator
from test_replication_pad_cuda import kernel_names  # tests/gpu
from test_upsample_nearest import CAUSAL_UPSAMPLE, INTERPOLATIONS, Decoder, causal_reference, op_arguments

pytestmark = pytest.mark.gpu

UPSAMPLE = torch.ops.cutlassfuse.upsample_nearest3d.default
CL = torch.channels_last_3d
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8]
SHAPES = {"video_frames": (1, 16, 4, 8, 8), "odd_sizes": (2, 3, 3, 5, 7)}
NEAREST = "cutlassfuse::NearestGrid"


def case_input(shape, dtype, memory_format):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.rand(shape, device="cuda", dtype=torch.float64, generator=g) * 200 - 100
    return x.to(dtype).contiguous(memory_format=memory_format)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("interpolation", list(INTERPOLATIONS))
@pytest.mark.parametrize("shape", list(SHAPES))
def test_kernel_gives_atens_upsampling_bitwise(shape, interpolation, memory_format, dtype):
    x = case_input(SHAPES[shape], dtype, memory_format)
    expected = F.interpolate(x, mode="nearest", **INTERPOLATIONS[interpolation])
    size, scales = op_arguments(x, INTERPOLATIONS[interpolation])
    poison_cuda_allocator(4 * expected.numel() * expected.element_size())
    out = UPSAMPLE(x, size, *scales)
    torch.cuda.synchronize()
    assert out.shape == expected.shape and out.dtype == dtype
    assert out.is_contiguous(memory_format=memory_format)
    assert torch.equal(out, expected), "an element differs or was not written"


@pytest.mark.parametrize(("memory_format", "kernel"), [(CL, "channels_last_gather_kernel"),
                                                       (torch.contiguous_format, "channels_first_gather_kernel")],
                         ids=["ndhwc", "ncdhw"])
def test_the_copy_kernel_runs_not_atens(memory_format, kernel):
    x = case_input(SHAPES["video_frames"], torch.float16, memory_format)
    names = kernel_names(lambda: UPSAMPLE(x, [8, 16, 16], 2.0, 2.0, 2.0))
    assert sum(f"{kernel}<{NEAREST}" in n for n in names) == 1, names
    assert not any("upsample_nearest3d_out_frame" in n for n in names), names


@pytest.mark.parametrize("call", ["strided_view", "int32", "unbatched"])
def test_calls_outside_the_kernel_take_atens_upsampling(call):
    x = case_input(SHAPES["video_frames"], torch.float16, torch.contiguous_format)
    if call == "strided_view":
        x = x[:, :, :, 1:5]
    elif call == "int32":
        x = x.to(torch.int32)
        with pytest.raises(RuntimeError):
            F.interpolate(x, scale_factor=2, mode="nearest")
        with pytest.raises(RuntimeError):
            UPSAMPLE(x, [8, 16, 16], 2.0, 2.0, 2.0)
        return
    else:
        x = x[0]
        with pytest.raises(RuntimeError):
            UPSAMPLE(x, [8, 16, 16], 2.0, 2.0, 2.0)
        return
    size = [2 * n for n in x.shape[2:]]
    names = kernel_names(lambda: UPSAMPLE(x, size, 2.0, 2.0, 2.0))
    assert not any("cutlassfuse" in n for n in names), names
    assert torch.equal(UPSAMPLE(x, size, 2.0, 2.0, 2.0), F.interpolate(x, scale_factor=2, mode="nearest"))


def test_recorded_calls_run_the_kernel_with_atens_gradient():
    x = torch.randn(2, 8, 4, 5, 6, device="cuda", dtype=torch.float64, requires_grad=True)
    names = kernel_names(lambda: UPSAMPLE(x, [8, 10, 12], 2.0, 2.0, 2.0))
    assert any(NEAREST in n for n in names) and not any("upsample_nearest3d_out_frame" in n for n in names), names
    out = UPSAMPLE(x, [8, 10, 12], 2.0, 2.0, 2.0)
    assert out.grad_fn.name() == "CutlassfuseUpsampleNearest3DBackward"
    grad = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, x, grad)
    (atens,) = torch.autograd.grad(F.interpolate(x, scale_factor=2, mode="nearest"), x, grad)
    assert torch.allclose(ours, atens, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_mode_sends_atens_pads_and_upsampling_to_the_copy_kernels(memory_format):
    x = case_input(SHAPES["video_frames"], torch.float16, memory_format)

    def pad_then_upsample():
        return F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2, mode="nearest")

    expected = pad_then_upsample()
    with KernelMode():
        names = kernel_names(pad_then_upsample)
        out = pad_then_upsample()
    assert torch.equal(out, expected)
    assert any(NEAREST in n for n in names) and any("PadGrid" in n or "replication_pad_ncdhw_rows" in n
                                                    for n in names), names
    assert not any("upsample_nearest3d_out_frame" in n or "replication_pad_forward" in n for n in names), names


def test_mode_leaves_unpacked_inputs_to_aten_and_counts_no_saving():
    frames = case_input((1, 3, 16, 8, 8), torch.float16, torch.contiguous_format)  # (n, t, c, h, w) in memory
    x = frames.permute(0, 2, 1, 3, 4)
    mode = KernelMode()
    with mode:
        out = F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2, mode="nearest")
    assert torch.equal(out, F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2,
                                          mode="nearest"))
    assert mode.cuda_ops and mode.saved_us > 0, "the padded output is packed: its upsampling is replaced"
    pad_only = KernelMode()
    with pad_only:
        F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate")
    assert pad_only.cuda_ops and pad_only.saved_us == 0


def test_mode_keeps_atens_gradients():
    x = torch.randn(1, 4, 3, 4, 5, device="cuda", dtype=torch.float64, requires_grad=True)
    with KernelMode():
        out = F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2, mode="nearest")
    grad = torch.randn_like(out)
    (ours,) = torch.autograd.grad(out, x, grad)
    expected = F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2, mode="nearest")
    (atens,) = torch.autograd.grad(expected, x, grad)
    assert torch.equal(out, expected) and torch.allclose(ours, atens, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=lambda t: str(t)[6:])
def test_fused_decoder_upsamples_with_the_copy_kernel(dtype):
    model = Decoder().to("cuda", dtype).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert len(result.kernel_mode) == 1, str(result)
    x = torch.randn(1, 4, 9, 512, 512, device="cuda", dtype=dtype)  # an upsampling large enough to pay
    with torch.no_grad():
        names = kernel_names(lambda: result.model(x))
        assert torch.allclose(result.model(x).float(), model(x).float(), atol=2e-2, rtol=2e-2)
    assert result.model.up.active is True, result.model.up.decision
    assert any(NEAREST in n for n in names), names
    assert not any("upsample_nearest3d_out_frame" in n for n in names), names


def test_kernel_mode_turns_off_where_it_does_not_pay():
    model = Decoder().to("cuda", torch.float16).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    x = torch.randn(1, 4, 3, 8, 8, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        result.model(x)  # the first CUDA call decides
        assert result.model.up.active is False, result.model.up.decision
        names = kernel_names(lambda: result.model(x))
        assert torch.allclose(result.model(x).float(), model(x).float(), atol=2e-2, rtol=2e-2)
    assert any("upsample_nearest3d_out_frame" in n for n in names), names
    assert not any(NEAREST in n for n in names), names


@pytest.mark.parametrize("channels_last", [False, True], ids=["input_layout", "channels_last"])
def test_fused_hunyuan_decoder_upsamples_in_its_layout(channels_last):
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLHunyuanVideo(block_out_channels=(32, 32, 64, 64), norm_num_groups=8,
                                              layers_per_block=1)
    decoder = vae.decoder.to("cuda", torch.float16).eval()
    result = cutlassfuse.fuse(copy.deepcopy(decoder), channels_last=channels_last)
    x = torch.randn(1, 16, 3, 8, 8, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        names = kernel_names(lambda: result.model(x))
        torch.testing.assert_close(result.model(x).float(), decoder(x).float(), atol=2e-2, rtol=2e-2)
    # One gather per upsampler, channels-last in either mode: the fused blocks hand on
    # channels-last activations and the traced .contiguous() calls keep their layout.
    assert sum(f"channels_last_gather_kernel<{NEAREST}" in n for n in names) == 3, names
    assert not any("CatArrayBatchedCopy" in n for n in names), names
    assert not any("upsample_nearest3d_out_frame" in n for n in names), names


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: str(t)[6:])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("frames", [1, 2, 5])
@pytest.mark.parametrize("factors", [(2, 2, 2), (1, 2, 2)], ids=["time_and_space", "space"])
def test_causal_kernel_gives_diffusers_upsampling_bitwise(factors, frames, memory_format, dtype):
    x = case_input((2, 16, frames, 8, 8), dtype, memory_format)
    expected = causal_reference(x, factors)
    poison_cuda_allocator(4 * expected.numel() * expected.element_size())
    names = kernel_names(lambda: CAUSAL_UPSAMPLE(x, [float(f) for f in factors]))
    out = CAUSAL_UPSAMPLE(x, [float(f) for f in factors])
    torch.cuda.synchronize()
    assert out.is_contiguous(memory_format=memory_format) and torch.equal(out, expected)
    assert [n for n in names if "cutlassfuse" in n] == [n for n in names if NEAREST in n] and len(names) == 1, names


def test_recorded_causal_calls_run_the_kernel_with_atens_gradient():
    x = torch.randn(1, 8, 3, 4, 5, device="cuda", dtype=torch.float64, requires_grad=True)
    names = kernel_names(lambda: CAUSAL_UPSAMPLE(x, [2.0, 2.0, 2.0]))
    assert len(names) == 1 and NEAREST in names[0], names
    out = CAUSAL_UPSAMPLE(x, [2.0, 2.0, 2.0])
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(causal_reference(x, (2, 2, 2)), x, grad)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0], expected, rtol=1e-12, atol=1e-12)
