"""Data-parallel training: two processes (torch.distributed with the gloo backend) train a
small decoder built with the module under DistributedDataParallel, each on half of the
batch; the gradients after DDP's all-reduce equal those of one process on the whole
batch. CPU tensors here; CUDA tensors, both processes on one GPU, on the GPU. TF32 is off
in every process: cuDNN may pick other algorithms for half the batch, and TF32's rounding
would then differ by more than the reduction order does."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import cutlassfuse

WORLD = 2
BATCH = 4  # split in two


def decoder() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 8, 3, 4, padding=1, bias=True),
                         cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 4, 2, 2, stride=2, bias=True),
                         nn.Conv3d(4, 1, 1))


def batch(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(BATCH, 8, 4, 4, 4, generator=generator)
    target = torch.randn(BATCH, 1, 8, 8, 8, generator=generator)
    return x.to(device), target.to(device)


def gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().cpu() for p in model.parameters()]


def train_one_step(rank: int, port: int, device: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.backends.cudnn.allow_tf32 = False
    try:
        model = DistributedDataParallel(decoder().to(device))
        x, target = batch(device)
        half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        F.mse_loss(model(x[half]), target[half]).backward()  # DDP averages the ranks' gradients
        results[rank] = gradients(model.module)
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_data_parallel(device: str) -> None:
    results = mp.Manager().dict()
    mp.spawn(train_one_step, args=(free_port(), device, results), nprocs=WORLD, join=True)
    single = decoder().to(device)
    x, target = batch(device)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        F.mse_loss(single(x), target).backward()
    expected = gradients(single)
    for rank in range(WORLD):
        assert len(results[rank]) == len(expected)
        for got, want in zip(results[rank], expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_data_parallel_cpu():
    check_data_parallel("cpu")


@pytest.mark.gpu
def test_data_parallel_cuda():
    check_data_parallel("cuda")
