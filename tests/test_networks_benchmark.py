"""The networks benchmark (cutlassfuse.network_bench, benchmarks/networks.py, `bench
--networks`) on the CPU in its tiny mode (skipped where MONAI is not installed): every
network runs in both memory formats with every column but torch.compile's, fuse() fuses
every chain, the fused model's output and gradient errors against float64 are eager's
order, the gradients are matched to the float64 network's by the original keys, and
each missed target is flagged (the GPU runs the same code at full size)."""

import copy
import csv
import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cutlassfuse import fuse
from cutlassfuse.__main__ import main
from cutlassfuse.network_bench import (
    NETWORKS,
    Row,
    gradient_errors,
    kernel_class,
    misses,
    output_gradient,
    parameter_gradients,
    run_network_bench,
)

pytest.importorskip("monai")

ROOT = Path(__file__).resolve().parents[1]
# The chains fuse() replaces in each tiny network (tests/test_rewrite_monai.py says which).
CHAINS = {"unet": 13, "basicunet": 18, "dynunet": 14, "segresnet": 25}
GRADIENT_NOTE = "fused gradient error largest at "


def networks_table(path: Path) -> str:
    """scripts/results_tables.py's table of a networks CSV."""
    spec = importlib.util.spec_from_file_location("results_tables", ROOT / "scripts" / "results_tables.py")
    results_tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results_tables)
    return results_tables.networks_table(path)


def test_network_benchmark_runs_every_network_on_cpu(tmp_path):
    out_csv = tmp_path / "networks.csv"
    # One thread: the tiny networks' many small ops lose more to waking a second thread
    # on shared cores than they gain.
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "networks.py"), "--device", "cpu", "--tiny",
                             "--dtypes", "float32", "--no-compile", "--train", "--rounds", "1", "--repeats", "1",
                             "--csv", str(out_csv)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["network"], r["memory_format"]) for r in rows] == [(f"{name}-tiny", layout) for name in CHAINS
                                                                  for layout in ("ncdhw", "channels_last")]
    for r in rows:
        # Nothing refused, nothing left alone, every forward() traced: at most the gradient's note.
        notes = r["notes"]
        assert notes == "" or notes.startswith(GRADIENT_NOTE), r
        assert int(r["chains_fused"]) == CHAINS[r["network"].removesuffix("-tiny")], r
        assert r["chains_left_alone"] == "0", r
        for key in ("compile_ms", "compile_fused_ms", "fused_over_compile", "compile_fused_over_fused"):
            assert r[key] == "", (key, r)
        for key in ("eager_ms", "fused_ms", "eager_train_ms", "fused_train_ms", "seconds"):
            assert float(r[key]) > 0, (key, r)
        assert float(r["fused_over_eager"]) == float(r["fused_ms"]) / float(r["eager_ms"])
        assert float(r["train_fused_over_eager"]) == float(r["fused_train_ms"]) / float(r["eager_train_ms"])
        for model in ("eager", "fused"):  # each runs convolutions and norms
            assert float(r[f"{model}_conv_ms"]) > 0 and float(r[f"{model}_norm_ms"]) > 0, r
        assert float(r["eager_max_abs"]) <= 1e-4 and float(r["fused_max_abs"]) <= 1e-4, r
        # float32 gradients against float64: rounding, not a wrong gradient.
        assert 0 < float(r["eager_grad_max_abs"]) <= 1e-4 and 0 < float(r["fused_grad_max_abs"]) <= 1e-4, r
        grad_ratio = float(r["grad_fused_over_eager"])
        assert grad_ratio == float(r["fused_grad_max_abs"]) / float(r["eager_grad_max_abs"])
        assert ("gradient error > 1.25x eager's" in r["misses"]) == (grad_ratio > 1.25), r
        assert notes.startswith(GRADIENT_NOTE) == (grad_ratio > 1.25), r
    assert f"of {len(rows)} rows miss a target" in result.stdout
    table = networks_table(out_csv).splitlines()
    assert len(table) == 4 + len(rows)  # the heading, a blank line, the header and its rule, a line per row
    for line, r in zip(table[4:], rows, strict=True):
        errors = f"| {float(r['eager_grad_max_abs']):.1e} / {float(r['fused_grad_max_abs']):.1e} |"
        assert line.startswith(f"| {r['network']} | float32 | {r['memory_format']} |") and line.endswith(errors)


def test_bench_cli_runs_a_network_in_bfloat16(tmp_path):
    path = tmp_path / "networks.csv"
    assert main(["bench", "--networks", "segresnet", "--device", "cpu", "--tiny", "--no-compile", "--dtypes",
                 "bfloat16", "--repeats", "1", "--rounds", "1", "--csv", str(path)]) == 0
    [r] = list(csv.DictReader(path.open()))
    assert (r["network"], r["dtype"], r["memory_format"]) == ("segresnet-tiny", "bfloat16", "ncdhw")
    # bfloat16's rounding, far above float32's; the fused model's of the same order.
    assert 1e-3 < float(r["eager_max_abs"]) < 0.2 and float(r["fused_max_abs"]) < 2 * float(r["eager_max_abs"]), r
    assert r["eager_grad_max_abs"] == r["fused_grad_max_abs"] == r["grad_fused_over_eager"] == "", r
    line = networks_table(path).splitlines()[-1]
    assert line.startswith("| segresnet-tiny | bfloat16 | ncdhw |") and line.endswith("| n/a / n/a |")
    assert "--dtypes bfloat16 " in networks_table(path)


def test_bench_cli_rejects_unknown_networks_and_blocks_with_networks():
    with pytest.raises(SystemExit, match="unknown networks resnet"):
        main(["bench", "--networks", "resnet", "--device", "cpu", "--tiny"])
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--networks", "--blocks", "kb61"])
    assert exit_info.value.code == 2


def test_networks_benchmark_without_monai_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "monai", None)
    monkeypatch.setitem(sys.modules, "monai.networks", None)
    with pytest.raises(SystemExit, match=r"needs MONAI \(pip install monai\)"):
        run_network_bench(["unet"], [torch.float32], ["ncdhw"], device="cpu", tiny=True)


def tiny_models() -> tuple[torch.nn.Module, torch.nn.Module, torch.Tensor]:
    """The tiny SegResNet in train mode, fuse()'s model of a deep copy, and an input."""
    network = next(n for n in NETWORKS if n.name == "segresnet").tiny()
    torch.manual_seed(0)
    eager = network.build().train()
    return eager, fuse(copy.deepcopy(eager)).model, torch.rand(network.input_shape)


def test_fused_gradients_are_found_under_the_original_keys():
    eager, fused, x = tiny_models()
    assert {name for name, _ in fused.named_parameters()} != {name for name, _ in eager.named_parameters()}
    gradient = output_gradient(eager(x), x.dtype)
    expected = parameter_gradients(eager, x, gradient)
    got = parameter_gradients(fused, x, gradient)
    assert got.keys() == expected.keys() == {name for name, _ in eager.named_parameters()}
    for key, tensor in expected.items():
        torch.testing.assert_close(got[key], tensor, rtol=1e-4, atol=1e-5, msg=key)


def test_gradient_errors_name_the_parameter_and_count_nan_as_infinite():
    eager, fused, x = tiny_models()
    key = "down_layers.1.1.conv1.conv.weight"  # a conv that fuse() moved into a block
    assert key not in dict(fused.named_parameters())
    fused.state_dict(keep_vars=True)[key].register_hook(lambda grad: grad * math.nan)
    errors = gradient_errors({"eager": eager, "fused": fused}, [x])
    assert 0 < errors["eager"].max_abs <= 1e-4
    assert errors["fused"].max_abs == math.inf and errors["fused"].parameter == key


def test_gradient_errors_are_the_largest_over_the_inputs():
    eager, fused, x = tiny_models()
    models = {"eager": eager, "fused": fused}
    inputs = [x, 4 * x, -x]
    each = [gradient_errors(models, [one]) for one in inputs]
    errors = gradient_errors(models, inputs)
    for name in models:
        assert errors[name].max_abs == max(error[name].max_abs for error in each)
    assert len({error["eager"].max_abs for error in each}) == len(inputs)  # the inputs' errors differ


def row(**values) -> Row:
    """A row of a network with the 3x target, every number not given unmeasured."""
    empty = {field.name: None for field in dataclasses.fields(Row)}
    return Row(**{**empty, "network": "basicunet", "fused_ms": 1.0, "misses": "", "notes": "", **values})


BASICUNET = next(n for n in NETWORKS if n.name == "basicunet")


@pytest.mark.parametrize(("values", "expected"), [
    ({}, ""),
    ({"fused_ms": None}, "fused model refused"),
    ({"fused_over_compile": 1.0}, "not faster than compile"),
    ({"fused_over_eager": 0.34}, "fused/eager > 1/3"),
    ({"fused_over_eager": 0.33}, ""),
    ({"compile_fused_over_fused": 1.01}, "compile(fused) slower than fused"),
    ({"eager_max_abs": 1e-2, "fused_max_abs": 1.1e-2}, "error above eager's"),
    ({"eager_max_abs": 1e-2, "fused_max_abs": 1e-2}, ""),
    ({"eager_max_abs": 1e-2, "fused_max_abs": math.nan}, "error above eager's"),
    ({"eager_train_ms": 5.0}, "fused training step refused"),
    ({"train_fused_over_eager": 1.0}, "training step not faster than eager's"),
    ({"eager_grad_max_abs": 1e-2, "fused_grad_max_abs": 1.25e-2}, ""),
    ({"eager_grad_max_abs": 1e-2, "fused_grad_max_abs": 1.3e-2}, "gradient error > 1.25x eager's"),
    ({"eager_grad_max_abs": 1e-2, "fused_grad_max_abs": math.inf}, "gradient error > 1.25x eager's"),
    ({"fused_over_compile": 1.1, "train_fused_over_eager": 1.2},
     "not faster than compile; training step not faster than eager's"),
])
def test_misses_name_each_target_missed(values, expected):
    assert misses(BASICUNET, row(**values)) == expected


@pytest.mark.parametrize(("kernel", "kind"), [
    ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_ndhwckrsc_ndhwc_tilesize128x128x64_warpgroupsize1x1x1", "conv"),
    ("void cudnn::ops::nchwToNhwcKernel<__half, __half, float, false, true, (cudnnKernelDataType_t)0>", "conv"),
    ("void cudnn::bn_fw_tr_1C11_singleread<__half, 512, true, 1, 2, 0>", "norm"),
    ("void at::native::batch_norm_collect_statistics_kernel<at::native::InvStd, c10::Half, float, float, int>",
     "norm"),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<c10::Half>", "norm"),
    ("void cutlassfuse::(anonymous namespace)::norm_activation_stats_kernel<__half>", "norm"),
    ("aten::native_group_norm", "norm"),
    ("aten::mkldnn_convolution", "conv"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::leaky_relu_kernel(at::TensorIteratorBase&)>",
     "other"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>>",
     "other"),
])
def test_kernel_classes(kernel, kind):
    assert kernel_class(kernel) == kind
