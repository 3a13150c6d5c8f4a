"""`python -m cutlassfuse` commands run as documented."""

import json
import subprocess
import sys

import pytest
import torch


def run(*args):
    return subprocess.run([sys.executable, "-m", "cutlassfuse", *args], capture_output=True, text=True, check=True,
                          timeout=600).stdout


def test_info_prints_json():
    facts = json.loads(run("info"))
    assert {"version", "torch_built_against", "cuda_architectures", "cutlass_version"} <= facts.keys()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU demo runs on the device (scripts/device_iteration.sh)")
def test_demo_runs_reduced_size_on_cpu():
    out = run("demo")
    assert "no CUDA device: reduced size" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("float32")]
    assert [row[1] for row in rows] == ["cutlassfuse", "pytorch"]
    for row in rows:
        assert float(row[2]) < 1e-5, row  # relative error against float64


@pytest.mark.parametrize("option", ["--dtypes=fp16", "--memory-formats=both", "--memory-formats=ncdhw,cl3d"])
def test_bench_rejects_unknown_values_before_running(option):
    from cutlassfuse.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["bench", option])
    assert exit_info.value.code == 2  # argparse's usage error, not a traceback


def test_data_parallel_outside_torchrun_is_a_usage_error(monkeypatch, capsys):
    from cutlassfuse.__main__ import main

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["data-parallel"])
    assert exit_info.value.code == 2
    assert "torchrun --nproc-per-node 2 -m cutlassfuse data-parallel" in capsys.readouterr().err
