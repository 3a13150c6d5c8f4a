"""benchmarks/networks.py on the CPU in its tiny mode (skipped where MONAI is not
installed): every network runs in both memory formats with every column but
torch.compile's, fuse() fuses every chain, and the fused model's error against float64
is eager's order (the GPU runs the same code at full size)."""

import csv
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("monai")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
# The chains fuse() replaces in each tiny network (tests/test_rewrite_monai.py says which).
CHAINS = {"unet": 13, "basicunet": 18, "dynunet": 14, "segresnet": 25}


def test_network_benchmark_runs_every_network_on_cpu(tmp_path):
    out_csv = tmp_path / "networks.csv"
    # One thread: the tiny networks' many small ops lose more to waking a second thread
    # on shared cores than they gain.
    result = subprocess.run([sys.executable, str(BENCHMARKS / "networks.py"), "--device", "cpu", "--tiny", "--dtypes",
                             "float32", "--no-compile", "--train", "--rounds", "1", "--repeats", "1", "--csv",
                             str(out_csv)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["network"], r["memory_format"]) for r in rows] == [(f"{name}-tiny", layout) for name in CHAINS
                                                                  for layout in ("ncdhw", "channels_last")]
    for r in rows:
        assert r["notes"] == "", r  # nothing refused, nothing left alone, forward() traced
        assert int(r["chains_fused"]) == CHAINS[r["network"].removesuffix("-tiny")], r
        assert r["chains_left_alone"] == "0", r
        for key in ("compile_ms", "compile_fused_ms", "fused_over_compile", "compile_fused_over_fused"):
            assert r[key] == "", (key, r)
        for key in ("eager_ms", "fused_ms", "eager_train_ms", "fused_train_ms"):
            assert float(r[key]) > 0, (key, r)
        assert float(r["fused_over_eager"]) == float(r["fused_ms"]) / float(r["eager_ms"])
        assert float(r["train_fused_over_eager"]) == float(r["fused_train_ms"]) / float(r["eager_train_ms"])
        for model in ("eager", "fused"):  # each runs convolutions and norms
            assert float(r[f"{model}_conv_ms"]) > 0 and float(r[f"{model}_norm_ms"]) > 0, r
        assert float(r["eager_max_abs"]) <= 1e-4 and float(r["fused_max_abs"]) <= 1e-4, r
    assert f"of {len(rows)} rows miss a target" in result.stdout


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
def test_kernel_classes(monkeypatch, kernel, kind):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    assert importlib.import_module("networks").kernel_class(kernel) == kind
