"""benchmarks/training_step.py on the CPU in its tiny mode: every benchmark layer's step
runs and its input gradient agrees with eager's (the GPU runs the same code at full size)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "training_step.py"


def test_training_step_benchmark_runs_on_cpu():
    result = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--dtypes", "float32",
                             "--no-compile", "--repeats", "2"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if re.match(r"\S+-tiny float32 ", line)]
    assert {(row[0], row[2]) for row in rows} == {(f"{name}-tiny", impl)
                                                  for name in ("kb61", "kb61_v0", "unet_k2s2", "gan_k4s2p1",
                                                               "vid_k3s2p1op1")
                                                  for impl in ("eager", "cutlassfuse", "recompute")}
    for row in rows:
        assert float(row[-1]) <= 1e-5, row  # max abs of the input gradient from eager's
