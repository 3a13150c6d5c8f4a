"""torch.ops.cutlassfuse.upsample_nearest3d on the CPU (ATen's upsample_nearest3d: the op's
reference) and its fake kernel; KernelMode and WithKernelMode, through which fuse()
runs the replicate pads, nearest upsampling and convolution bias adds of code it cannot trace, on the CPU (where
they pass every op through)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlassfuse
from cutlassfuse.kernel_mode import HOST_US_PER_OP, KernelMode, WithKernelMode, _packed

UPSAMPLE = torch.ops.cutlassfuse.upsample_nearest3d.default
CL = torch.channels_last_3d

# F.interpolate's arguments; the op's (output size, scales) follow from them as ATen's do.
INTERPOLATIONS = {
    "double": dict(scale_factor=2.0),
    "frames_kept": dict(scale_factor=(1.0, 2.0, 2.0)),
    "odd_factors": dict(scale_factor=(1.5, 0.5, 3.0)),
    "sizes": dict(size=(5, 7, 3)),
}


def op_arguments(x, interpolation):
    """(output size, scales) of aten::upsample_nearest3d for F.interpolate's `interpolation`."""
    if "size" in interpolation:
        return list(interpolation["size"]), [None, None, None]
    factors = interpolation["scale_factor"]
    factors = factors if isinstance(factors, tuple) else (factors,) * 3
    return [int(size * factor) for size, factor in zip(x.shape[2:], factors, strict=True)], list(factors)


@pytest.mark.parametrize("name", list(INTERPOLATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_op_on_the_cpu_is_atens_upsampling(name, dtype, memory_format):
    x = (torch.rand(2, 3, 4, 5, 6) * 100).to(dtype).contiguous(memory_format=memory_format)
    size, scales = op_arguments(x, INTERPOLATIONS[name])
    out, expected = UPSAMPLE(x, size, *scales), F.interpolate(x, mode="nearest", **INTERPOLATIONS[name])
    assert torch.equal(out, expected) and out.is_contiguous(memory_format=memory_format)


def test_op_passes_opcheck_in_both_layouts():
    x = torch.randn(2, 3, 4, 5, 6)
    torch.library.opcheck(UPSAMPLE, (x, [8, 10, 12], 2.0, 2.0, 2.0))
    torch.library.opcheck(UPSAMPLE, (x.contiguous(memory_format=CL), [5, 7, 3], None, None, None))
    torch.library.opcheck(UPSAMPLE, (torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=True),
                                     [3, 8, 10], 1.0, 2.0, 2.0))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_fake_output_has_the_real_outputs_shape_and_layout(memory_format):
    x = torch.randn(1, 8, 3, 4, 5).contiguous(memory_format=memory_format)
    real = UPSAMPLE(x, [6, 8, 10], 2.0, 2.0, 2.0)
    with FakeTensorMode() as mode:
        fake = UPSAMPLE(mode.from_tensor(x), [6, 8, 10], 2.0, 2.0, 2.0)
    assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype


def test_op_that_autograd_records_has_atens_derivatives():
    x = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    out = UPSAMPLE(x, [6, 8, 10], 2.0, 2.0, 2.0)
    assert out.grad_fn.name() == "CutlassfuseUpsampleNearest3DBackward"  # the op's kernel ran, its node recorded
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(F.interpolate(x, scale_factor=2.0, mode="nearest"), x, grad)
    assert torch.equal(torch.autograd.grad(out, x, grad)[0], expected)
    torch.autograd.gradcheck(lambda t: UPSAMPLE(t, [6, 8, 10], 2.0, 2.0, 2.0), (x,))
    torch.autograd.gradgradcheck(lambda t: UPSAMPLE(t, [5, 7, 3], None, None, None), (x,))


def test_invalid_calls_raise_atens_errors():
    with pytest.raises(RuntimeError):
        UPSAMPLE(torch.randn(2, 3, 4, 5, 6), [1, 1], None, None, None)
    with pytest.raises(RuntimeError):
        UPSAMPLE(torch.randn(5, 6), [2, 2, 2], None, None, None)
    with pytest.raises(RuntimeError):
        UPSAMPLE(torch.randn(1, 1, 2, 2, 2), [0, 4, 4], None, None, None)


def test_copy_kernel_mode_passes_cpu_calls_through():
    x = torch.randn(1, 2, 3, 4, 5, requires_grad=True)
    with KernelMode():
        out = F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2, mode="nearest")
    assert torch.equal(out, F.interpolate(F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate"), scale_factor=2,
                                          mode="nearest"))
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


class FrameUpsampler(nn.Module):
    """diffusers' HunyuanVideoUpsampleCausal3D in small: a branch on the number of frames
    (no trace of its forward()), nearest upsampling, a causal convolution."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 4, 3, padding=1)

    def forward(self, x):
        first, rest = x.split((1, x.shape[2] - 1), dim=2)
        first = F.interpolate(first.squeeze(2), scale_factor=2, mode="nearest").unsqueeze(2)
        if x.shape[2] > 1:
            x = torch.cat((first, F.interpolate(rest.contiguous(), scale_factor=2, mode="nearest")), dim=2)
        return self.conv(x)


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.GroupNorm(2, 4)
        self.up = FrameUpsampler()

    def forward(self, x):
        return self.up(F.silu(self.norm(x))) if x.shape[2] > 0 else x


def test_fuse_runs_untraced_code_under_the_kernel_mode():
    model = Decoder().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert isinstance(result.model.up, WithKernelMode) and isinstance(result.model.up.module, FrameUpsampler)
    assert result.kernel_mode == ["up: FrameUpsampler's untraced code: ATen's replicate pads, nearest upsampling"
                                  " and convolution bias adds -> cutlassfuse's kernels, where its first CUDA"
                                  " call finds that they pay"]
    assert "up: FrameUpsampler's untraced code" in str(result)
    assert result.model.state_dict().keys() == model.state_dict().keys()
    x = torch.randn(1, 4, 3, 4, 5)
    with torch.no_grad():
        assert torch.allclose(result.model(x), model(x), atol=1e-5)
    assert result.model.up.active is None, "calls without CUDA tensors leave the mode undecided"


def test_kernel_mode_replaces_packed_inputs_only():
    x = torch.randn(1, 4, 3, 5, 6)
    assert _packed(x) and _packed(x.contiguous(memory_format=torch.channels_last_3d))
    assert not _packed(x.transpose(1, 2)) and not _packed(x[:, :, :, 1:]) and not _packed(x[0])


@pytest.mark.parametrize("ops, margin_us, pays", [(10, -1.0, False), (10, 1.0, True), (0, 0.0, False)])
def test_kernel_mode_pays_where_its_saving_exceeds_its_host_time(ops, margin_us, pays):
    mode = KernelMode()
    mode.ops, mode.saved_us = ops, HOST_US_PER_OP * ops + margin_us
    assert mode.pays() is pays


class UntracedBlock(nn.Module):
    """An untraceable module whose child is untraceable too (diffusers' CogVideoX blocks)."""

    def __init__(self):
        super().__init__()
        self.up = FrameUpsampler()

    def forward(self, x):
        return self.up(x) if x.shape[2] > 1 else x


def test_nested_untraced_code_runs_under_one_kernel_mode():
    model = nn.Sequential(UntracedBlock()).eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    wrappers = [name for name, m in result.model.named_modules() if isinstance(m, WithKernelMode)]
    assert wrappers == ["0"], wrappers
    assert [line.split(":")[0] for line in result.kernel_mode] == ["0"], str(result)
    assert result.model.state_dict().keys() == model.state_dict().keys()
    x = torch.randn(1, 4, 3, 4, 5)
    with torch.no_grad():
        assert torch.allclose(result.model(x), model(x), atol=1e-5)


def test_wrapped_code_compiles_without_the_mode():
    calls = []

    class Counting(KernelMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls.append(func)
            return super().__torch_dispatch__(func, types, args, kwargs)

    wrapped = WithKernelMode(FrameUpsampler().eval())
    x = torch.randn(1, 4, 3, 4, 5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("cutlassfuse.kernel_mode.KernelMode", Counting)
        with torch.no_grad():
            expected = wrapped(x)
            assert calls, "eager calls run under the mode"
            calls.clear()
            compiled = torch.compile(wrapped, backend="eager")
            assert torch.equal(compiled(x), expected) and calls == []


CAUSAL_UPSAMPLE = torch.ops.cutlassfuse.causal_upsample_nearest3d.default


def causal_reference(x, factors):
    """diffusers' HunyuanVideoUpsampleCausal3D upsampling: frame 0 in space, the later
    frames in time and space, concatenated."""
    first = F.interpolate(x[:, :, 0], scale_factor=factors[1:], mode="nearest").unsqueeze(2)
    if x.shape[2] == 1:
        return first
    return torch.cat((first, F.interpolate(x[:, :, 1:].contiguous(), scale_factor=factors, mode="nearest")), dim=2)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("frames", [1, 2, 5])
@pytest.mark.parametrize("factors", [(2, 2, 2), (1, 2, 2), (3, 1, 2)], ids=["all", "space", "odd"])
def test_causal_upsampling_is_diffusers(factors, frames, memory_format):
    x = torch.randn(2, 3, frames, 4, 5, dtype=torch.float64).contiguous(memory_format=memory_format)
    out = CAUSAL_UPSAMPLE(x, [float(f) for f in factors])
    assert torch.equal(out, causal_reference(x, factors))
    assert out.is_contiguous(memory_format=memory_format)


def test_causal_upsampling_opcheck_and_gradients():
    x = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(CAUSAL_UPSAMPLE, (x, [2.0, 2.0, 2.0]))
    out = CAUSAL_UPSAMPLE(x, [2.0, 2.0, 2.0])
    assert out.grad_fn.name() == "CutlassfuseCausalUpsampleNearest3DBackward"
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(causal_reference(x, (2, 2, 2)), x, grad)
    assert torch.equal(torch.autograd.grad(out, x, grad)[0], expected)
    torch.autograd.gradcheck(lambda t: CAUSAL_UPSAMPLE(t, [2.0, 1.0, 2.0]), (x,))
    torch.autograd.gradgradcheck(lambda t: CAUSAL_UPSAMPLE(t, [1.0, 2.0, 2.0]), (x,))


@pytest.mark.parametrize(("shape", "factors", "message"), [
    ((2, 3, 4, 5), [2.0, 2.0, 2.0], "5-D"), ((1, 2, 3, 4, 5), [2.0, 2.0], "three positive"),
    ((1, 2, 3, 4, 5), [2.0, 0.0, 2.0], "three positive")])
def test_causal_upsampling_invalid_calls_raise(shape, factors, message):
    with pytest.raises(RuntimeError, match=message):
        CAUSAL_UPSAMPLE(torch.randn(shape), factors)
