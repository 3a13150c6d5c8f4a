"""The traceable stand-ins of library forward() code (cutlassfuse.traceable_forwards):
the same values as the module's own forward() on every input it takes, and fuse() tracing
the models that hold them whole (skipped where MONAI is not installed)."""

import io

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse.rewrite import _one_channel_input_as_channels_last
from cutlassfuse.traceable_forwards import skip_concatenation, stand_in

from fuse_checks import randomized

basic_unet = pytest.importorskip("monai.networks.nets.basic_unet")


def up_cat(is_pad: bool = True) -> nn.Module:
    """An UpCat as BasicUNet builds them: 8 channels upsampled by a transposed convolution
    to 4, joined with 4 skip channels."""
    module = basic_unet.UpCat(3, 8, 4, 4, act=("LeakyReLU", {"negative_slope": 0.1}),
                              norm=("instance", {"affine": True}), bias=True, dropout=0.0, upsample="deconv",
                              is_pad=is_pad)
    return randomized(module.double(), seed=0)


# (the input's spatial size, the skip's, is_pad): the skip twice the input (no padding), one
# voxel more along each dimension alone and along all three (padded); without is_pad UpCat
# takes only the first.
CASES = [((4, 4, 4), (8, 8, 8), True), ((4, 4, 4), (9, 8, 8), True), ((4, 4, 4), (8, 9, 8), True),
         ((4, 4, 4), (8, 8, 9), True), ((4, 5, 3), (9, 11, 7), True), ((4, 5, 3), (8, 10, 6), False)]


@pytest.mark.parametrize("size,skip_size,is_pad", CASES, ids=[str(c) for c in CASES])
def test_skip_concatenation_is_upcats_merge(size, skip_size, is_pad):
    module = up_cat(is_pad)
    x = torch.rand(1, 8, *size, dtype=torch.float64)
    skip = torch.rand(1, 4, *skip_size, dtype=torch.float64)
    expected = module(x, skip)
    got = module.convs(skip_concatenation(module.upsample(x), skip, module.is_pad))
    assert torch.equal(got, expected)


def test_skip_concatenation_without_a_skip_is_the_upsampled_features():
    module = up_cat()
    x = torch.rand(1, 8, 4, 4, 4, dtype=torch.float64)
    upsampled = module.upsample(x)
    assert skip_concatenation(upsampled, None, True) is upsampled


class TwoLevels(nn.Module):
    """A BasicUNet-like pair: a convolution whose output is the skip of an UpCat, and an
    UpCat taking none."""

    def __init__(self):
        super().__init__()
        self.encode = nn.Conv3d(1, 4, 3, padding=1)
        self.down = nn.Conv3d(4, 8, 2, stride=2)
        self.up = up_cat().float()
        self.up_alone = basic_unet.UpCat(3, 4, 0, 4, act=("LeakyReLU", {"negative_slope": 0.1}),
                                         norm=("instance", {"affine": True}), bias=True, dropout=0.0,
                                         upsample="deconv", halves=False)

    def forward(self, x):
        skip = self.encode(x)
        merged = self.up(self.down(skip), skip)
        return self.up_alone(merged, None)


@pytest.mark.parametrize("size", [(8, 8, 8), (9, 10, 11)], ids=["even", "odd"])
def test_fuse_traces_models_holding_upcat_whole(size):
    """The stand-in makes the whole forward() traceable: its blocks fused, its
    activations channels-last, its values the original's on sizes that pad and that do not."""
    model = randomized(TwoLevels().double(), seed=1)
    x = torch.rand(1, 1, *size, dtype=torch.float64)
    expected = model(x)
    result = cutlassfuse.fuse(model)
    assert result.not_traced is None and result.channels_last, str(result)
    assert len(result.replaced) == 4, str(result)  # each UpCat's TwoConv: two conv -> norm -> activation
    torch.testing.assert_close(result.model(x), expected, rtol=1e-12, atol=1e-12)


def test_stand_ins_are_keyed_by_the_library_class_and_its_forward_source():
    assert stand_in(up_cat()) is not None
    assert stand_in(nn.Conv3d(1, 1, 1)) is None

    class UpCat(basic_unet.UpCat):  # a release whose forward() reads otherwise
        def forward(self, x, x_e):
            return self.convs(self.upsample(x))

    UpCat.__module__, UpCat.__qualname__ = basic_unet.UpCat.__module__, "UpCat"
    changed = UpCat(3, 8, 4, 4, act=("LeakyReLU", {"negative_slope": 0.1}), norm=("instance", {"affine": True}),
                    bias=True, dropout=0.0, upsample="deconv")
    assert stand_in(changed) is None


def test_a_pickled_fused_model_keeps_its_opaque_calls():
    """A GraphModule pickles as its code, traced again as it loads: the stand-in's merge
    (and the channels-last view of a one-channel input) stay calls on the real tensors,
    not the branch a traced value would take."""
    model = randomized(TwoLevels().double(), seed=1)
    x = torch.rand(1, 1, 9, 10, 11, dtype=torch.float64)
    fused = cutlassfuse.fuse(model).model
    expected = fused(x)
    buffer = io.BytesIO()
    torch.save(fused, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    targets = [node.target for node in loaded.graph.nodes if node.op == "call_function"]
    assert skip_concatenation in targets and _one_channel_input_as_channels_last in targets, targets
    out = loaded(x)
    assert torch.equal(out, expected) and out.is_contiguous()
