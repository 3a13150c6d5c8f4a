"""The registered operator and the package around it: schema, library loading, explain(),
info(), the packed operands, cutlassfuse.backends' flags and the float32 mode."""

import inspect
import itertools

import pytest
import torch

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.ops import _pack_bias, _pack_weight

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


def test_explain_says_what_a_call_in_grad_mode_keeps():
    x, w = torch.rand(1, 8, 3, 3, 3), torch.randn(8, 8, 3, 3, 3)
    assert "keeping for the backward" not in cutlassfuse.explain(x, w, num_groups=2)
    w.requires_grad_()
    assert "keeping for the backward" in cutlassfuse.explain(x, w, num_groups=2)
    with torch.no_grad():
        assert "keeping for the backward" not in cutlassfuse.explain(x, w, num_groups=2)


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


def test_packed_operands_are_the_modules_not_the_functional_ops():
    """A packed copy is read instead of the weight and the bias, so a stale one would give
    a wrong result: only the module passes them (from its cache), the functional op and
    explain() take none, and the packing functions are private."""
    for function in (cutlassfuse.conv_transpose3d_relu_group_norm, cutlassfuse.explain):
        assert not {"packed_weight", "packed_bias"} & set(inspect.signature(function).parameters)
    x, w = torch.rand(1, 8, 3, 3, 3), torch.randn(8, 8, 3, 3, 3)
    with pytest.raises(TypeError, match="packed_weight"):
        cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2, packed_weight=_pack_weight(w))
    for name in ("pack_weight", "pack_bias", "packed_weight", "packed_bias"):
        assert not hasattr(cutlassfuse, name) and name not in cutlassfuse.__all__, name
        assert not hasattr(cutlassfuse.ConvTranspose3dReLUGroupNorm, name), name


def test_pack_weight_is_the_kernel_layout():
    """Element (i, a, b, c, o) of the packed weight is weight[i, o, a, b, c]: each weight
    value encodes its own index, and every packed element is checked to sit where the
    kernel reads it."""
    shape = (4, 6, 3, 2, 5)  # (C_in, C_out, kD, kH, kW)
    w = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)
    packed = _pack_weight(w)
    assert packed.shape == (4, 3, 2, 5, 6) and packed.is_contiguous()
    for i, a, b, c, o in itertools.product(*(range(n) for n in packed.shape)):
        assert packed[i, a, b, c, o] == (((i * 6 + o) * 3 + a) * 2 + b) * 5 + c
    assert _pack_weight(w.requires_grad_()).grad_fn is None, "a packed copy is never differentiated"


def test_pack_bias_repeats_the_bias_per_output_block():
    """Value block * C_out + c of the packed bias is bias[c], for every one of the
    stride_d * stride_h * stride_w blocks of a kernel == stride layer's GEMM row."""
    b = torch.tensor([0.5, -1.0, 2.0])
    for stride, blocks in [(1, 1), (2, 8), ((2, 1, 3), 6)]:
        packed = _pack_bias(b, stride)
        assert packed.shape == (blocks * 3,) and packed.is_contiguous()
        assert [packed[block * 3 + c].item() for block in range(blocks) for c in range(3)] == b.tolist() * blocks


def test_module_packs_nothing_on_cpu():
    layer = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 8, 2, 2, bias=True, stride=2)
    assert layer._conv_operands()[2:] == (None, None)


REMOVED_SWITCHES = ["set_dgrad_config", "set_skip_border_taps", "set_drawn_tile_schedule", "set_fused_path_enabled",
                    "set_phase_streams"]
DEFAULT_FLAGS = dict(fused_path=True, dgrad_config="auto", skip_border_taps=True, drawn_tile_schedule=True,
                     phase_streams=1, conv_gradients="auto", resident_norm=True)


def test_kernel_switches_live_in_backends_only():
    for name in REMOVED_SWITCHES:
        assert not hasattr(cutlassfuse, name), name
        assert name not in cutlassfuse.__all__, name
    for name in ("set_fused_path_enabled", "set_phase_streams"):
        assert not hasattr(cutlassfuse.ops, name), name


def test_backend_flags_default_set_and_restore():
    """The flags exist in every build (a CPU-only one too, where they change nothing)."""
    assert backends.get_flags() == DEFAULT_FLAGS
    previous = backends.set_flags(fused_path=False, phase_streams=3)
    try:
        assert previous == DEFAULT_FLAGS
        assert backends.get_flags() == {**DEFAULT_FLAGS, "fused_path": False, "phase_streams": 3}
        # None leaves a flag as it is; the others change.
        assert backends.set_flags(skip_border_taps=False) == {**DEFAULT_FLAGS, "fused_path": False,
                                                             "phase_streams": 3}
        assert backends.get_flags() == {**DEFAULT_FLAGS, "fused_path": False, "phase_streams": 3,
                                         "skip_border_taps": False}
    finally:
        backends.set_flags(**DEFAULT_FLAGS)
    assert backends.get_flags() == DEFAULT_FLAGS


def test_backend_flags_context_restores_on_exit_and_on_exceptions():
    config = backends.dgrad_configs()[0]
    changed = dict(fused_path=False, dgrad_config=config, skip_border_taps=False, drawn_tile_schedule=False,
                   phase_streams=8, conv_gradients="cutlass", resident_norm=False)
    with backends.flags(**changed):
        assert backends.get_flags() == changed
        with backends.flags(phase_streams=2):  # nested: only the flag given changes
            assert backends.get_flags() == {**changed, "phase_streams": 2}
        assert backends.get_flags() == changed
    assert backends.get_flags() == DEFAULT_FLAGS
    with pytest.raises(KeyError):  # the flags are restored whatever ends the block
        with backends.flags(drawn_tile_schedule=False, dgrad_config=config):
            assert backends.get_flags() == {**DEFAULT_FLAGS, "drawn_tile_schedule": False, "dgrad_config": config}
            raise KeyError
    assert backends.get_flags() == DEFAULT_FLAGS


@pytest.mark.parametrize("invalid", [dict(phase_streams=0), dict(phase_streams=9), dict(phase_streams=-1),
                                     dict(dgrad_config="128x128_cluster2x1"), dict(dgrad_config="heuristic"),
                                     dict(conv_gradients="cudnn")],
                         ids=["streams_0", "streams_9", "streams_negative", "cluster2x1_without_pingpong",
                              "unknown_config", "unknown_conv_gradients"])
def test_invalid_backend_flags_raise_and_change_nothing(invalid):
    with backends.flags(fused_path=False, skip_border_taps=False):
        before = backends.get_flags()
        with pytest.raises(ValueError):
            backends.set_flags(drawn_tile_schedule=False, **invalid)  # a valid change beside the invalid one
        assert backends.get_flags() == before
        with pytest.raises(ValueError):
            with backends.flags(**{"drawn_tile_schedule": False, **invalid}):
                raise AssertionError("the block must not run")
        assert backends.get_flags() == before
    assert backends.get_flags() == DEFAULT_FLAGS


def test_every_dgrad_config_is_accepted():
    configs = backends.dgrad_configs()
    # The configurations the heuristic chooses: the ping-pong kernel's two tiles and both
    # cluster sizes.
    assert sorted(configs) == ["128x128_pingpong", "128x128_pingpong_cluster2x1", "128x64_pingpong"]
    for name in configs:
        with backends.flags(dgrad_config=name):
            assert backends.get_flags()["dgrad_config"] == name
    assert backends.get_flags()["dgrad_config"] == "auto"


@pytest.mark.parametrize("name", ["128x128_cluster1x1", "128x64_cluster1x1"])
def test_dgrad_config_of_cutlass_conv_kernel_is_unknown(name):
    # CUTLASS's non-persistent conv kernel is not compiled: pinning it names the choices.
    known = ", ".join(["auto", *backends.dgrad_configs()])
    with pytest.raises(ValueError, match=f"unknown dgrad_config '{name}'; known: {known}$"):
        backends.set_flags(dgrad_config=name)
    assert backends.get_flags() == DEFAULT_FLAGS


def test_every_conv_gradients_choice_is_accepted():
    for name in ("aten", "cutlass", "auto"):
        with backends.flags(conv_gradients=name):
            assert backends.get_flags()["conv_gradients"] == name
    with pytest.raises(ValueError, match="unknown conv_gradients 'cudnn'; known: auto, aten, cutlass"):
        backends.set_flags(conv_gradients="cudnn")
    assert backends.get_flags() == DEFAULT_FLAGS


def test_float32_mode_setting():
    assert cutlassfuse.get_float32_mode() == "pytorch"
    assert cutlassfuse.info()["float32_mode"] == "pytorch"
    with pytest.raises(ValueError, match="unknown float32 mode 'tf64'; known: pytorch, tf32, bf16x3"):
        cutlassfuse.set_float32_mode("tf64")
    for mode in ("tf32", "bf16x3"):
        with pytest.raises(KeyError):  # the mode is restored whatever ends the block
            with cutlassfuse.float32_mode(mode):
                assert cutlassfuse.get_float32_mode() == mode
                assert cutlassfuse.info()["float32_mode"] == mode
                raise KeyError
        assert cutlassfuse.get_float32_mode() == "pytorch"


def test_set_float32_tensor_cores_is_deprecated_and_still_works():
    """A FutureWarning naming its replacement, as PyTorch deprecates user-facing APIs."""
    with pytest.warns(FutureWarning, match=r"set_float32_tensor_cores\(True\) is deprecated; use "
                                           r"cutlassfuse.set_float32_mode\('bf16x3'\)"):
        cutlassfuse.set_float32_tensor_cores(True)
    try:
        assert cutlassfuse.get_float32_mode() == "bf16x3"
    finally:
        with pytest.warns(FutureWarning, match=r"set_float32_mode\('pytorch'\)") as warned:
            cutlassfuse.set_float32_tensor_cores(False)
    assert cutlassfuse.get_float32_mode() == "pytorch"
    assert warned[0].filename == __file__, "the warning points at the caller's line"
