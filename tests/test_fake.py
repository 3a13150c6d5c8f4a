"""Fake-tensor (meta) propagation: torch.compile, export and FakeTensorMode see the
same shapes, dtypes and memory formats as the real kernels produce."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlassfuse
from cutlassfuse.testing import make_inputs, op_arguments

OP = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default


def sample_args(channels_last=False, bias=True, affine=True):
    """The registered op's positional arguments: conv groups, per-dimension stride,
    padding, output_padding and dilation."""
    return op_arguments(make_inputs(batch=2, in_channels=8, out_channels=8, size=(3, 4, 5), kernel=(3, 2, 3),
                                    stride=(2, 1, 1), padding=(1, 0, 1), output_padding=(1, 0, 0), groups=2,
                                    dilation=(1, 1, 2), num_groups=4, bias=bias, affine=affine,
                                    channels_last=channels_last))


@pytest.mark.parametrize("channels_last", [False, True])
def test_fake_matches_real(channels_last):
    args = sample_args(channels_last)
    real = OP(*args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = OP(*fake_args)
    assert fake.shape == real.shape
    assert fake.dtype == real.dtype
    assert fake.stride() == real.stride()


@pytest.mark.parametrize("bias,affine", [(True, True), (False, False)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck(channels_last, bias, affine):
    torch.library.opcheck(OP, sample_args(channels_last, bias, affine),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                      "test_aot_dispatch_static"))


def test_fake_kernel_rejects_mismatched_channels():
    with FakeTensorMode():
        x = torch.empty(1, 8, 3, 3, 3)
        w = torch.empty(4, 8, 3, 3, 3)
        with pytest.raises(ValueError, match="weight.shape"):
            OP(x, w, None, None, None, 2, 1e-5, [1] * 3, [0] * 3, [0] * 3, 1, [1] * 3, None)


@pytest.mark.parametrize("change,message", [
    (dict(num_groups=0), "num_groups"),
    (dict(num_groups=3), "num_groups"),
    (dict(groups=3), "divisible by groups"),
    (dict(output_padding=[1, 0, 0]), "output_padding"),
    (dict(input_shape=(1, 8, 0, 3, 3)), "only the batch"),
    (dict(input_shape=(1, 0, 3, 3, 3), weight_shape=(0, 8, 3, 3, 3)), "only the batch"),
    (dict(padding=[3, 0, 0]), "empty"),
    (dict(stride=[0, 1, 1]), "stride"),
    (dict(eps=-1.0), "eps"),
], ids=["zero_groups", "groups_not_dividing", "conv_groups", "output_padding", "empty_depth", "zero_in_channels",
        "empty_output", "zero_stride", "negative_eps"])
def test_fake_kernel_rejects_what_the_real_one_rejects(change, message):
    """The same exception kind from the real kernel and the fake one."""
    args = dict(num_groups=2, groups=1, output_padding=[0, 0, 0], padding=[0, 0, 0], stride=[1, 1, 1], eps=1e-5,
                input_shape=(1, 8, 3, 3, 3), weight_shape=(8, 8, 3, 3, 3))
    args.update(change)
    x, w = torch.rand(args["input_shape"]), torch.rand(args["weight_shape"])
    call = [args["num_groups"], args["eps"], args["stride"], args["padding"], args["output_padding"], args["groups"],
            [1] * 3, None]
    with pytest.raises(ValueError, match=message):
        OP(x, w, None, None, None, *call)
    with FakeTensorMode() as mode, pytest.raises(ValueError, match=message):
        OP(mode.from_tensor(x), mode.from_tensor(w), None, None, None, *call)


def test_torch_compile_fullgraph():
    args = sample_args()

    def fn(x, w, b, gamma, beta):
        return cutlassfuse.conv_transpose3d_relu_group_norm(
            x, w, b, stride=(2, 1, 1), padding=(1, 0, 1), output_padding=(1, 0, 0), groups=2, dilation=(1, 1, 2),
            num_groups=4, norm_weight=gamma, norm_bias=beta) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*args[:5]), fn(*args[:5]))


META_CALLS = {
    "plain": dict(batch=2, in_channels=8, out_channels=16, size=4, kernel=3, num_groups=4, bias=False, affine=False),
    "strided_channels_last_input": dict(batch=2, in_channels=8, out_channels=16, size=(3, 4, 5), kernel=3, stride=2,
                                        padding=1, output_padding=1, num_groups=4, channels_last=True),
    "grouped_dilated": dict(batch=1, in_channels=8, out_channels=8, size=(3, 4, 5), kernel=(3, 2, 3),
                            stride=(2, 1, 1), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2, num_groups=2),
}


def _on_meta(inputs: dict, dtype: torch.dtype, requires_grad: bool) -> dict:
    return {name: value.detach().to("meta", dtype).requires_grad_(requires_grad) if isinstance(value, torch.Tensor)
            else value for name, value in inputs.items()}


@pytest.mark.parametrize("requires_grad", [False, True], ids=["inference", "autograd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("call", META_CALLS)
def test_meta_tensors_give_the_outputs_metadata(call, dtype, requires_grad):
    """Meta tensors on every build (CPU-only and CUDA): a meta output of the shape
    F.conv_transpose3d gives and the memory format the real kernels give (the CPU
    composite's); through the autograd kernel, the backward runs shape-only too."""
    inputs = make_inputs(**META_CALLS[call])
    real = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    meta = _on_meta(inputs, dtype, requires_grad)
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**meta)
    conv_args = [meta[name] for name in ("input", "weight", "bias", "stride", "padding", "output_padding", "groups",
                                         "dilation")]
    assert out.device.type == "meta" and out.dtype == dtype
    assert out.shape == torch.nn.functional.conv_transpose3d(*conv_args).shape == real.shape
    assert out.stride() == real.stride()
    assert out.requires_grad == requires_grad
    if requires_grad:
        out.sum().backward()
        for name, value in meta.items():
            if isinstance(value, torch.Tensor):
                assert value.grad.device.type == "meta" and value.grad.shape == value.shape, name
    assert cutlassfuse.explain(**meta).startswith("meta")


def test_module_on_the_meta_device():
    """ConvTranspose3dReLUGroupNorm(..., device="meta") and fuse() of a model on the meta
    device run shape-only, forward and backward."""
    block = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True, stride=2, padding=1, device="meta")
    assert all(p.device.type == "meta" for p in block.parameters())
    x = torch.empty(2, 8, 4, 5, 6, device="meta")
    out = block(x, output_size=[8, 10, 12])
    assert out.device.type == "meta" and out.shape == (2, 16, 8, 10, 12)
    out.sum().backward()
    assert block.conv_transpose.weight.grad.device.type == "meta"

    model = torch.nn.Sequential(torch.nn.ConvTranspose3d(8, 16, 3, device="meta"), torch.nn.ReLU(),
                                torch.nn.GroupNorm(4, 16, device="meta"))
    fused = cutlassfuse.fuse(model).model
    assert isinstance(fused[0], cutlassfuse.ConvTranspose3dReLUGroupNorm)
    assert fused(x).shape == model(x).shape == (2, 16, 6, 7, 8)


@pytest.mark.parametrize("change", [dict(stride=[2**31] * 3), dict(dilation=[2**62] * 3)], ids=["stride", "dilation"])
def test_fake_kernel_refuses_outputs_beyond_the_storage_limit(change):
    """The C++ validation's check and message, in the fake kernel: before torch.compile or
    a meta model allocates anything."""
    args = dict(num_groups=2, eps=1e-5, stride=[1] * 3, padding=[0] * 3, output_padding=[0] * 3, groups=1,
                dilation=[1] * 3)
    args.update(change)
    x, w = torch.rand(1, 8, 3, 3, 3), torch.rand(8, 8, 3, 3, 3)
    with pytest.raises(ValueError, match="output size overflows") as real:
        OP(x, w, None, None, None, *args.values())
    with FakeTensorMode() as mode, pytest.raises(ValueError, match="output size overflows") as fake:
        OP(mode.from_tensor(x), mode.from_tensor(w), None, None, None, *args.values())
    assert str(fake.value) == str(real.value)


@pytest.mark.parametrize("input_format", [torch.contiguous_format, torch.channels_last_3d], ids=["ncdhw", "cl"])
@pytest.mark.parametrize(("device", "dtype", "kept_format"), [
    ("cuda", torch.float16, torch.channels_last_3d),
    ("cuda", torch.bfloat16, torch.channels_last_3d),
    ("cuda", torch.float32, None),
    ("cpu", torch.float16, None),
])
def test_block_keeps_its_conv_output_channels_last_in_16_bits_on_cuda(device, dtype, kept_format, input_format):
    """The fake kernel of the block op keeping for its backward: the convolution's output
    channels-last for float16/bfloat16 CUDA calls (where the kernels convolve channels-last
    operands), else in the output's layout (None); the output in the input's layout."""
    with FakeTensorMode():
        x = torch.empty(2, 8, 4, 5, 6, device=device, dtype=dtype).contiguous(memory_format=input_format)
        w = torch.empty(16, 8, 3, 3, 3, device=device, dtype=dtype)
        out, kept, mean, rstd = torch.ops.cutlassfuse.conv3d_norm_activation_for_backward(
            x, w, None, [1, 1, 1], [1, 1, 1], [0, 0, 0], 1, [1, 1, 1], False, 4, None, None, 1e-5, "relu", 0.0,
            None, False)
    assert out.is_contiguous(memory_format=input_format)
    assert kept.shape == out.shape and kept.is_contiguous(memory_format=kept_format or input_format)
    assert mean.shape == rstd.shape == (2, 4)
