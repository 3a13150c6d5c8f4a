"""The bench CLI's shape handling and arithmetic (its timing needs a GPU)."""

import pytest

from cutlassfuse.bench import DEFAULT_SHAPES, parse_shape


def test_default_shapes_match_the_baselines():
    kb61 = parse_shape("kb61")
    assert kb61.output_size() == (34, 34, 34)
    assert kb61.useful_flops() / 1e9 == pytest.approx(231.9, abs=0.1)  # briefs/baselines.md
    assert parse_shape("vid_k3s2p1op1").output_size() == (16, 64, 64)
    assert parse_shape("gan_k4s2p1").output_size() == (16, 16, 16)
    assert [s.name for s in DEFAULT_SHAPES] == ["kb61", "kb61_v0", "unet_k2s2", "gan_k4s2p1", "vid_k3s2p1op1"]


def test_custom_shape():
    shape = parse_shape("2,8,16,4,4,4,3,2,1,1,4")
    assert (shape.batch, shape.in_channels, shape.out_channels, shape.stride, shape.groups) == (2, 8, 16, 2, 4)
    assert shape.output_size() == (8, 8, 8)


def test_bad_shape_is_explained():
    with pytest.raises(ValueError, match="give a name"):
        parse_shape("1,2,3")
