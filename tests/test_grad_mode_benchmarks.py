"""benchmarks/grad_mode.py and benchmarks/kernelbench_harness.py on the CPU in their tiny
mode: every case runs and reports its row (the GPU runs the same code at full size)."""

import csv
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script: str, *options: str) -> str:
    result = subprocess.run([sys.executable, str(BENCHMARKS / script), "--device", "cpu", "--tiny", *options],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_grad_mode_benchmark_runs_every_case_on_cpu(tmp_path):
    out_csv = tmp_path / "grad.csv"
    printed = run("grad_mode.py", "--shapes", "vid_k3s2p1op1", "--rounds", "1", "--repeats", "1", "--csv",
                  str(out_csv))
    rows = list(csv.DictReader(out_csv.open()))
    cases = ["float16", "float16 fallback", "bfloat16", "bfloat16 fallback", "float32 pytorch", "float32 tf32",
             "float32 bf16x3", "float32 fallback"]
    assert [(r["shape"], r["case"]) for r in rows] == [("vid_k3s2p1op1-tiny", case) for case in cases]
    for r in rows:
        assert r["path"] == "reference", r  # the CPU runs PyTorch's composite
        assert float(r["max_abs_grad_vs_no_grad"]) == 0.0, r
        timings = [float(r[k]) for k in ("eager_no_grad_ms", "eager_grad_ms", "cutlassfuse_no_grad_ms",
                                         "cutlassfuse_grad_ms")]
        assert min(timings) > 0, r
        assert float(r["grad_over_no_grad"]) == float(r["cutlassfuse_grad_ms"]) / float(r["cutlassfuse_no_grad_ms"])
    assert f"of {len(rows)} rows miss a target" in printed
    largest = max(float(r["eager_grad_ms"]) / float(r["eager_no_grad_ms"]) for r in rows)
    assert f"eager's own grad mode / no_grad: up to {largest:.2f}x in this run" in printed


def test_kernelbench_harness_runs_every_precision_on_cpu():
    printed = run("kernelbench_harness.py", "--trials", "2")
    rows = {line.split()[0]: line for line in printed.splitlines() if line.split()[:1] in (["fp32"], ["fp16"],
                                                                                          ["bf16"])}
    assert set(rows) == {"fp32", "fp16", "bf16"}
    assert "5/5 at 1e-04  5/5 at 1e-02" in rows["fp32"]
    assert "5/5 at 1e-02" in rows["fp16"] and "5/5 at 1e-02" in rows["bf16"]
