"""`torchrun --nproc-per-node 2 -m cutlassfuse data-parallel` on two GPUs: NCCL, a GPU per
process, each on half of every batch. DistributedDataParallel and FSDP2 (``fully_shard``)
train the decoder of fused blocks in float32 (TF32 off) and under float16 and bfloat16
autocast, and after each SGD step the gradients and the parameters equal those of one
process taking that step on the whole batch (``cutlassfuse.data_parallel`` has the
tolerances and why they hold); on Hopper the fused sm90 path runs the 16-bit blocks."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest
import torch

from cutlassfuse.testing import fused_path_expected

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

# --standalone: torchrun picks a free port on this host rather than the fixed default.
COMMAND = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "cutlassfuse", "data-parallel"]
MODES = ("DDP", "FSDP2")
DTYPES = ("float32", "float16", "bfloat16")
STEPS = 4  # the command's default
TIMEOUT_S = 300
STOP_TIMEOUT_S = 60  # torchrun's SIGTERM to its processes, and its SIGKILL 30 s later


def run_command() -> tuple[int, str]:
    """The command's exit status and output. torchrun starts each process in a session of
    its own and stops them when it gets SIGTERM: on a timeout it gets that, so that no
    process is left holding a GPU. The output goes through a file, which processes left
    behind cannot hold open as they would a pipe."""
    with tempfile.TemporaryFile("w+") as log:
        launcher = subprocess.Popen(COMMAND, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            launcher.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            launcher.terminate()
            launcher.wait(timeout=STOP_TIMEOUT_S)
            log.seek(0)
            pytest.fail(f"{' '.join(COMMAND)} ran past {TIMEOUT_S} s:\n{log.read()}")
        log.seek(0)
        return launcher.returncode, log.read()


def test_ddp_and_fsdp2_on_two_gpus_train_as_one_process():
    status, output = run_command()
    assert status == 0, output
    rows = [line.split() for line in output.splitlines() if line.startswith(MODES)]
    assert [(row[0], row[1], int(row[2])) for row in rows] == [
        (mode, dtype, step) for dtype in DTYPES for mode in MODES for step in range(1, STEPS + 1)], output
    assert all(row[-1] == "PASS" for row in rows), output
    if fused_path_expected():
        assert "float16 fused_sm90, fused_sm90; bfloat16 fused_sm90, fused_sm90" in output, output
