"""FewChannelConv3d: which convolutions fuse() gives it, that it is the same nn.Conv3d
(parameters, keys, results on the CPU, PyTorch's errors), and fuse()'s report of it."""

import copy

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse.few_channel_conv import FewChannelConv3d

from fuse_checks import assert_checkpoints_load_both_ways


@pytest.mark.parametrize(("conv", "taken"), [
    (nn.Conv3d(2, 2, 3, padding=1), True),
    (nn.Conv3d(7, 4, 1, stride=(1, 1, 2), bias=False), True),
    (nn.Conv3d(1, 16, 3, stride=2, padding=1), False),  # 8 or more output channels
    (nn.Conv3d(8, 4, 3), False),  # input channels already a multiple of 8
    (nn.Conv3d(4, 4, 3, groups=2), False),
    (nn.Conv3d(4, 4, 3, padding=1, padding_mode="reflect"), False),
    (nn.ConvTranspose3d(4, 4, 2, stride=2), False),
    (FewChannelConv3d(1, 4, 3), False),  # only plain nn.Conv3d
])
def test_takes_plain_conv3d_with_fewer_than_8_input_and_output_channels(conv, taken):
    assert FewChannelConv3d.takes(conv) is taken


def test_same_parameters_keys_and_cpu_results():
    conv = nn.Conv3d(2, 8, 3, stride=(1, 2, 2), padding=1, dilation=1)
    padded = FewChannelConv3d.from_conv(conv)
    assert padded.weight is conv.weight and padded.bias is conv.bias
    assert list(padded.state_dict()) == list(conv.state_dict())
    x = torch.randn(2, 2, 5, 6, 7, requires_grad=True)
    assert torch.equal(padded(x), conv(x))
    padded(x).sum().backward()
    assert conv.weight.grad is not None and x.grad is not None
    with pytest.raises(RuntimeError, match="channels"):
        padded(torch.randn(1, 3, 4, 4, 4))


def test_fuse_gives_plain_few_channel_convs_outside_the_blocks_and_reports_them():
    model = nn.Sequential(nn.Conv3d(1, 8, 3, padding=1), nn.InstanceNorm3d(8, affine=True), nn.ReLU(),
                          nn.Conv3d(8, 8, 1), nn.Conv3d(8, 2, 1)).eval()
    head = nn.Sequential(nn.Conv3d(2, 4, 1, stride=2)).eval()
    whole = nn.Sequential(model, head).eval()
    original = copy.deepcopy(whole)
    result = cutlassfuse.fuse(whole)
    assert type(result.model[0][0]).__name__ == "Conv3dNormActivation"
    assert type(result.model[0][0].conv) is nn.Conv3d  # the block pads its own input channels
    assert type(result.model[1][0]) is FewChannelConv3d
    assert result.few_channel_convs == [
        "1.0: Conv3d(2->4, kernel=(1, 1, 1), stride=(2, 2, 2)) -> FewChannelConv3d: a direct convolution in "
        "float16/bfloat16 on CUDA, its 2 input channel(s) padded to 8 (tensor cores) where autograd records the call"]
    assert result.few_channel_convs[0] in str(result)
    x = torch.randn(1, 1, 4, 4, 4)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), original(x), rtol=1e-5, atol=1e-5)
    assert_checkpoints_load_both_ways(lambda: copy.deepcopy(original), (x,))


def test_direct_conv3d_op_on_the_cpu_is_atens_convolution_and_passes_opcheck():
    x = torch.randn(2, 3, 5, 6, 7)
    w, b = torch.randn(4, 3, 3, 1, 3), torch.randn(4)
    arguments = (x, w, b, [1, 2, 1], [1, 0, 2], [1, 1, 2])
    assert torch.equal(torch.ops.cutlassfuse.direct_conv3d(*arguments), torch.nn.functional.conv3d(*arguments))
    torch.library.opcheck(torch.ops.cutlassfuse.direct_conv3d.default, arguments)
    channels_last = (x.contiguous(memory_format=torch.channels_last_3d), w, None, [1, 1, 1], [0, 0, 0], [1, 1, 1])
    torch.library.opcheck(torch.ops.cutlassfuse.direct_conv3d.default, channels_last)


def test_direct_conv3d_op_that_autograd_records_is_atens_differentiable_convolution():
    x = torch.randn(1, 2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    arguments = (x, w, b, [1, 1, 2], [1, 1, 1], [1, 1, 1])
    out = torch.ops.cutlassfuse.direct_conv3d(*arguments)
    assert out.grad_fn is not None
    torch.autograd.gradcheck(lambda *t: torch.ops.cutlassfuse.direct_conv3d(*t, *arguments[3:]), arguments[:3])
    torch.library.opcheck(torch.ops.cutlassfuse.direct_conv3d.default, arguments)
    tangent = torch.randn_like(x)
    _, jvp = torch.func.jvp(lambda t: torch.ops.cutlassfuse.direct_conv3d(t, w.detach(), b.detach(), *arguments[3:]),
                            (x.detach(),), (tangent,))
    assert torch.allclose(jvp, torch.nn.functional.conv3d(tangent, w.detach(), None, *arguments[3:]))
