"""Data-parallel training: two processes (torch.distributed with the gloo backend) train a
small decoder of fused blocks under DistributedDataParallel and under FSDP2
(``fully_shard``), each on half of every batch, and after each SGD step the gradients and
the parameters equal those of one process taking that step on the whole batch, within the
tolerances of ``cutlassfuse.data_parallel`` (which has the decoder, the steps and why each
tolerance holds). CPU tensors here; on the GPU, DDP with both processes on one GPU
(gloo); NCCL with a GPU per process is tests/gpu/test_data_parallel_gpus.py."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cutlassfuse.data_parallel import compare_with_one_process, format_table, worst_over_processes

WORLD = 2
STEPS = 3


def run_process(rank: int, port: int, device: str, modes: list[str], dtypes: list[torch.dtype], results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results[rank] = compare_with_one_process(torch.device(device), modes, dtypes, STEPS)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_data_parallel(device: str, modes: list[str], dtypes: list[torch.dtype]) -> None:
    results = mp.Manager().dict()
    mp.spawn(run_process, args=(free_port(), device, modes, dtypes, results), nprocs=WORLD, join=True)
    rows = worst_over_processes([results[rank] for rank in range(WORLD)])
    assert [(row.mode, row.dtype, row.step) for row in rows] == [
        (mode, str(dtype).removeprefix("torch."), step) for dtype in dtypes for mode in modes
        for step in range(1, STEPS + 1)]
    assert all(row.passed for row in rows), "\n" + format_table(rows)


def test_ddp_and_fsdp2_train_as_one_process_on_cpu():
    check_data_parallel("cpu", ["DDP", "FSDP2"], [torch.float32, torch.bfloat16])


@pytest.mark.gpu
def test_ddp_trains_as_one_process_with_both_processes_on_one_gpu():
    check_data_parallel("cuda:0", ["DDP"], [torch.float32, torch.float16, torch.bfloat16])
