"""The invalid-call matrix (tests/invalid_calls.py), each case in a process of its own:
the expected exception, never a crash, on CPU tensors (CI) and on CUDA tensors (`gpu`);
the next valid call in the same process returns correct results."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from invalid_calls import CASES, cases_for

RUNNER = Path(__file__).with_name("invalid_calls.py")


def _params():
    params = [pytest.param(case, "cpu", id=f"cpu-{case.name}") for case in cases_for("cpu")]
    cuda_cases = cases_for("cuda") if torch.cuda.is_available() else CASES
    params += [pytest.param(case, "cuda", id=f"cuda-{case.name}", marks=pytest.mark.gpu) for case in cuda_cases]
    return params


@pytest.mark.parametrize("case,device", _params())
def test_invalid_call(case, device):
    process = subprocess.run([sys.executable, str(RUNNER), case.name, device], capture_output=True, text=True,
                             timeout=300)
    assert process.returncode == 0, f"the process died (exit {process.returncode}): {process.stderr[-2000:]}"
    result = json.loads(process.stdout.strip().splitlines()[-1])
    if case.error is None:
        assert result["raised"] is None, result
        assert result["mismatch"] == "", result
    else:
        assert result["raised"] == case.error.__name__, result
        assert re.search(case.match, result["message"]), result
        assert result["message"].startswith("cutlassfuse: "), result
    assert result["next_valid_call"] == "", result
