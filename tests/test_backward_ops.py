"""The ops behind the backward: the forward that keeps what the backward reads, and the
ReLU + GroupNorm backward, against eager autograd in float64, the layout copy between
them and cuDNN, and the convolution's gradients, through opcheck."""

import pytest
import torch
import torch.nn.functional as F

from cutlassfuse.testing import make_inputs, op_arguments

FOR_BACKWARD = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm_for_backward.default
BACKWARD = torch.ops.cutlassfuse.relu_group_norm_backward.default
OP = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default
CONVERT = torch.ops.cutlassfuse.convert_memory_format.default
INPUT_GRAD = torch.ops.cutlassfuse.conv_transpose3d_input_grad.default
WEIGHT_GRAD = torch.ops.cutlassfuse.conv_transpose3d_weight_grad.default

CONFIGS = [
    dict(in_channels=4, out_channels=6, size=(3, 3, 3), kernel=2, num_groups=3),
    dict(in_channels=4, out_channels=8, size=(3, 2, 3), kernel=3, stride=2, padding=1, output_padding=1, num_groups=2),
    dict(in_channels=2, out_channels=6, size=(2, 3, 2), kernel=1, num_groups=1, affine=False, bias=False),
]


def call(config, dtype=torch.float64, **options):
    return make_inputs(batch=2, **config, dtype=dtype, **options)


def eager_activation(a):
    return F.relu(F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                                     a["output_padding"], a["groups"], a["dilation"]))


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_forward_keeps_the_activation_and_statistics(config):
    a = call(config)
    out, activation, mean, rstd = FOR_BACKWARD(*op_arguments(a))
    torch.testing.assert_close(out, OP(*op_arguments(a)), rtol=0, atol=0)
    expected = eager_activation(a)
    assert activation.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(activation, expected, rtol=1e-12, atol=1e-12)
    grouped = expected.reshape(expected.shape[0], a["num_groups"], -1)
    assert mean.dtype == rstd.dtype == torch.float64 and mean.shape == (expected.shape[0], a["num_groups"])
    torch.testing.assert_close(mean, grouped.mean(-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rstd, (grouped.var(-1, unbiased=False) + a["eps"]).rsqrt(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_forward_keeping_the_conv_output(config, channels_last):
    """keep_conv_output: the convolution's output without bias, in the output's layout,
    from which the block family's backward recomputes ReLU(y + bias) and gives eager's
    gradients."""
    a = call(config, channels_last=channels_last)
    out, kept, mean, rstd = FOR_BACKWARD(*op_arguments(a), True)
    torch.testing.assert_close(out, OP(*op_arguments(a)), rtol=1e-12, atol=1e-12)
    assert kept.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    conv = F.conv_transpose3d(a["input"], a["weight"], None, a["stride"], a["padding"], a["output_padding"],
                              a["groups"], a["dilation"])
    torch.testing.assert_close(kept, conv, rtol=1e-12, atol=1e-12)
    _, _, expected_mean, expected_rstd = FOR_BACKWARD(*op_arguments(a))
    torch.testing.assert_close(mean, expected_mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rstd, expected_rstd, rtol=1e-10, atol=1e-10)
    grad = torch.randn(out.shape, dtype=torch.float64)
    from_conv_output = torch.ops.cutlassfuse.norm_activation_backward(
        grad, kept, a["bias"], mean, rstd, a["norm_weight"], a["norm_bias"], a["num_groups"], "relu", 0.0, None, True)
    _, activation, _, _ = FOR_BACKWARD(*op_arguments(a))
    from_activation = BACKWARD(grad, activation, mean, rstd, a["norm_weight"], a["num_groups"])
    for got, expected in zip(from_conv_output[:4], from_activation, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("stride", [(2, 2, 2), (1, 2, 3)], ids=["cube", "mixed"])
def test_forward_keeping_space_to_depth_order(stride):
    """keep_space_to_depth: the activation of a kernel == stride layer in the pixel-shuffle
    GEMM's order, [N, D, H, W, sD, sH, sW, C] over the input's D, H, W: output pixel
    (d*sD + i, h*sH + j, w*sW + k) of channel c at [n, d, h, w, i, j, k, c]."""
    a = call(dict(in_channels=4, out_channels=6, size=(3, 2, 4), kernel=stride, stride=stride, num_groups=3))
    out, kept, mean, rstd = FOR_BACKWARD(*op_arguments(a), False, True)
    expected_out, activation, expected_mean, expected_rstd = FOR_BACKWARD(*op_arguments(a))
    assert torch.equal(out, expected_out) and torch.equal(mean, expected_mean) and torch.equal(rstd, expected_rstd)
    assert kept.is_contiguous() and kept.shape == (2, 3, 2, 4, *stride, 6)
    for n, d, h, w, i, j, k, c in [(0, 0, 0, 0, 0, 0, 0, 0), (1, 2, 1, 3, 1, 1, 2, 5), (1, 1, 0, 2, 0, 1, 1, 3)]:
        i, j, k = min(i, stride[0] - 1), min(j, stride[1] - 1), min(k, stride[2] - 1)
        pixel = activation[n, c, d * stride[0] + i, h * stride[1] + j, w * stride[2] + k]
        assert kept[n, d, h, w, i, j, k, c] == pixel
    torch.testing.assert_close(kept.sum(dim=(4, 5, 6)).permute(0, 4, 1, 2, 3),
                               F.avg_pool3d(activation, stride, divisor_override=1), rtol=1e-12, atol=1e-12)
    torch.library.opcheck(FOR_BACKWARD, (*op_arguments(a), False, True))
    # The backward reads either order.
    grad = torch.randn(out.shape, dtype=torch.float64)
    from_space_to_depth = BACKWARD(grad, kept, mean, rstd, a["norm_weight"], a["num_groups"])
    for got, expected in zip(from_space_to_depth, BACKWARD(grad, activation, mean, rstd, a["norm_weight"],
                                                           a["num_groups"]), strict=True):
        assert torch.equal(got, expected)
    torch.library.opcheck(BACKWARD, (grad, kept, mean, rstd, a["norm_weight"], a["num_groups"]))


def test_keeping_op_refuses_contradictory_or_impossible_orders():
    a = call(CONFIGS[1])
    with pytest.raises(ValueError, match="two different kept tensors"):
        FOR_BACKWARD(*op_arguments(call(CONFIGS[0])), True, True)
    with pytest.raises(ValueError, match="pixel-shuffle GEMM's layers"):
        FOR_BACKWARD(*op_arguments(a), False, True)


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_backward_matches_eager_autograd(config):
    a = call(config)
    _, activation, mean, rstd = FOR_BACKWARD(*op_arguments(a))
    grad = torch.randn(activation.shape, dtype=torch.float64)
    dz, dgamma, dbeta, dbias = BACKWARD(grad, activation, mean, rstd, a["norm_weight"], a["num_groups"])

    z = F.conv_transpose3d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"]).detach().requires_grad_()
    gamma = None if a["norm_weight"] is None else a["norm_weight"].detach().requires_grad_()
    beta = None if a["norm_bias"] is None else a["norm_bias"].detach().requires_grad_()
    F.group_norm(F.relu(z), a["num_groups"], gamma, beta, a["eps"]).backward(grad)
    torch.testing.assert_close(dz, z.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dbias, z.grad.sum((0, 2, 3, 4)), rtol=1e-10, atol=1e-12)
    if gamma is not None:
        torch.testing.assert_close(dgamma, gamma.grad, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(dbeta, beta.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", CONFIGS, ids=range(len(CONFIGS)))
def test_opcheck(config):
    a = call(config, torch.float32)
    torch.library.opcheck(FOR_BACKWARD, op_arguments(a))
    torch.library.opcheck(FOR_BACKWARD, (*op_arguments(a), True))
    _, activation, mean, rstd = FOR_BACKWARD(*op_arguments(a))
    grad = torch.randn(activation.shape)
    torch.library.opcheck(BACKWARD, (grad, activation, mean, rstd, a["norm_weight"], a["num_groups"]))


@pytest.mark.parametrize("channels_last", [True, False])
def test_convert_memory_format(channels_last):
    x = torch.randn(2, 8, 3, 4, 5)
    source = x if channels_last else x.contiguous(memory_format=torch.channels_last_3d)
    converted = CONVERT(source, channels_last)
    expected = torch.channels_last_3d if channels_last else torch.contiguous_format
    assert converted.is_contiguous(memory_format=expected) and torch.equal(converted, x)
    assert converted.data_ptr() != source.data_ptr()
    torch.library.opcheck(CONVERT, (source, channels_last))


GRADIENT_LAYERS = [
    dict(in_channels=8, out_channels=8, size=(3, 3, 3), kernel=4, stride=2, padding=1, num_groups=2),
    dict(in_channels=8, out_channels=16, size=(2, 3, 2), kernel=3, stride=2, padding=1, output_padding=1,
         num_groups=4),
    dict(in_channels=4, out_channels=8, size=(3, 2, 3), kernel=2, stride=2, num_groups=2, channels_last=True),
]


@pytest.mark.parametrize("layer", GRADIENT_LAYERS, ids=range(len(GRADIENT_LAYERS)))
def test_convolution_gradient_ops(layer):
    a = call(layer)
    geometry = (a["stride"], a["padding"], a["output_padding"], a["groups"], a["dilation"])
    z = F.conv_transpose3d(a["input"], a["weight"], None, a["stride"], a["padding"], a["output_padding"],
                           a["groups"], a["dilation"])
    grad = torch.randn_like(z)
    x = a["input"].detach().requires_grad_()
    w = a["weight"].detach().requires_grad_()
    F.conv_transpose3d(x, w, None, *geometry[:3], a["groups"], a["dilation"]).backward(grad)
    for op, want in ((INPUT_GRAD, x.grad), (WEIGHT_GRAD, w.grad)):
        got = op(grad, a["input"], a["weight"], *geometry)
        assert got.is_contiguous(memory_format=torch.channels_last_3d)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.library.opcheck(op, (grad.float(), a["input"].float(), a["weight"].float(), *geometry))
