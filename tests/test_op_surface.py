"""The registered operator: schema, library loading, explain() and info()."""

import pytest
import torch

import cutlassfuse

EXPECTED_ARGUMENTS = [
    ("input", "Tensor"), ("weight", "Tensor"), ("bias", "Optional[Tensor]"), ("norm_weight", "Optional[Tensor]"),
    ("norm_bias", "Optional[Tensor]"), ("num_groups", "int"), ("eps", "float"), ("stride", "List[int]"),
    ("padding", "List[int]"), ("output_padding", "List[int]"), ("groups", "int"), ("dilation", "List[int]"),
    ("packed_weight", "Optional[Tensor]"), ("packed_bias", "Optional[Tensor]"),
]


def test_op_is_registered_with_full_schema():
    schema = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default._schema
    assert schema.name == "cutlassfuse::conv_transpose3d_relu_group_norm"
    assert [(a.name, str(a.type)) for a in schema.arguments] == EXPECTED_ARGUMENTS
    assert [str(r.type) for r in schema.returns] == ["Tensor"]
    assert not any(a.alias_info for a in schema.arguments), "the op must not mutate its inputs"


def test_op_has_cpu_and_cuda_kernels():
    op = "cutlassfuse::conv_transpose3d_relu_group_norm"
    for key in ("CPU", "CUDA"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, key), key


def test_explain_on_cpu_names_the_reference_path():
    x, w = torch.rand(1, 8, 3, 3, 3), torch.randn(8, 8, 3, 3, 3)
    assert cutlassfuse.explain(x, w, num_groups=2).startswith("reference")


def test_explain_validates_like_the_op():
    x, w = torch.rand(1, 8, 3, 3, 3), torch.randn(8, 8, 3, 3, 3)
    try:
        cutlassfuse.explain(x, w, num_groups=3)
    except ValueError as error:
        assert "num_groups" in str(error)
    else:
        raise AssertionError("explain accepted num_groups=3 for 8 channels")


def test_info_reports_build_facts():
    facts = cutlassfuse.info()
    assert facts["version"] == cutlassfuse.__version__
    assert facts["torch_built_against"].split("+")[0] == torch.__version__.split("+")[0]
    assert isinstance(facts["cuda_kernels"], bool)
    if facts["cuda_kernels"]:
        assert facts["cuda_architectures"], "a CUDA build must list its architectures"
        assert facts["cutlass_version"] == "4.2.0"
    else:
        assert facts["cuda_architectures"] == []
    assert (facts["device"] is None) == (not torch.cuda.is_available())


def test_pack_weight_is_the_kernel_layout():
    w = torch.randn(4, 6, 3, 2, 1)
    packed = cutlassfuse.pack_weight(w)
    assert packed.shape == (4, 3, 2, 1, 6) and packed.is_contiguous()
    assert torch.equal(packed, w.permute(0, 2, 3, 4, 1))


def test_packed_weight_gives_the_same_result():
    x, w = torch.rand(1, 8, 3, 3, 3), torch.randn(8, 8, 3, 3, 3)
    plain = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2)
    packed = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2, packed_weight=cutlassfuse.pack_weight(w))
    assert torch.equal(plain, packed)


def test_packed_bias_gives_the_same_result():
    x, w, b = torch.rand(2, 8, 3, 3, 3), torch.randn(8, 8, 2, 2, 2), torch.randn(8)
    plain = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, b, 2, num_groups=2)
    packed = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, b, 2, num_groups=2,
                                                          packed_bias=cutlassfuse.pack_bias(b, 2))
    assert torch.equal(plain, packed)
    assert torch.equal(cutlassfuse.pack_bias(b, (2, 1, 3)), torch.cat([b] * 6))


def test_module_packs_nothing_on_cpu():
    layer = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 8, 2, 2, bias=True, stride=2)
    assert layer.packed_weight() is None and layer.packed_bias() is None


@pytest.mark.skipif(not cutlassfuse.info()["cuda_kernels"], reason="CPU-only build has no sm90 configurations")
def test_set_dgrad_config_checks_names():
    with pytest.raises(ValueError, match="unknown dgrad config.*128x128_pingpong_cluster2x1"):
        cutlassfuse.set_dgrad_config("128x128_cluster2x1")  # clusters of two run on the ping-pong kernel only
    for name in ["128x128_pingpong", "128x64_pingpong", "128x128_pingpong_cluster2x1", "128x128_cluster1x1",
                 "128x64_cluster1x1"]:
        cutlassfuse.set_dgrad_config(name)
    cutlassfuse.set_dgrad_config(None)


def test_phase_streams_knob_takes_one_to_eight():
    x, w = torch.rand(1, 8, 2, 2, 2), torch.rand(8, 8, 2, 2, 2)
    expected = cutlassfuse.conv_transpose3d_relu_group_norm(x, w, stride=2, num_groups=2)
    cutlassfuse.set_phase_streams(8)
    try:
        assert torch.equal(cutlassfuse.conv_transpose3d_relu_group_norm(x, w, stride=2, num_groups=2), expected)
    finally:
        cutlassfuse.set_phase_streams(1)
    for lanes in (0, 9):
        with pytest.raises(ValueError, match="1 to 8"):
            cutlassfuse.set_phase_streams(lanes)


@pytest.mark.parametrize("switch,changed,default", [
    (cutlassfuse.set_float32_tensor_cores, True, False),
    (cutlassfuse.set_fused_path_enabled, False, True),
    (cutlassfuse.set_skip_border_taps, False, True),
    (cutlassfuse.set_drawn_tile_schedule, False, True),
], ids=["float32_tensor_cores", "fused_path", "border_taps", "drawn_tile_schedule"])
def test_path_switches_leave_the_cpu_reference(switch, changed, default):
    x, w = torch.rand(1, 8, 2, 2, 2), torch.rand(8, 8, 3, 3, 3)
    switch(changed)
    try:
        assert cutlassfuse.explain(x, w, num_groups=2).startswith("reference")
    finally:
        switch(default)


def test_float32_mode_setting():
    assert cutlassfuse.get_float32_mode() == "pytorch"
    assert cutlassfuse.info()["float32_mode"] == "pytorch"
    with pytest.raises(ValueError, match="unknown float32 mode 'tf64'; known: pytorch, bf16x3"):
        cutlassfuse.set_float32_mode("tf64")
    with pytest.raises(KeyError):  # the mode is restored whatever ends the block
        with cutlassfuse.float32_mode("bf16x3"):
            assert cutlassfuse.get_float32_mode() == "bf16x3"
            raise KeyError
    assert cutlassfuse.get_float32_mode() == "pytorch"
    cutlassfuse.set_float32_tensor_cores(True)
    try:
        assert cutlassfuse.get_float32_mode() == "bf16x3"
    finally:
        cutlassfuse.set_float32_tensor_cores(False)
    assert cutlassfuse.get_float32_mode() == "pytorch"
