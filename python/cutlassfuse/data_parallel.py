"""`python -m cutlassfuse data-parallel`, run by torchrun: DistributedDataParallel and FSDP2
(``fully_shard``) each train a small decoder of fused blocks for a few SGD steps, every
process on its share of each batch, and after every step the gradients and the parameters
are compared with one process taking the same step on the whole batch.

float32 runs with TF32 off (cuDNN may pick other algorithms for a share of the batch, and
TF32's operand rounding would then differ by far more than the summation order does).
float16 and bfloat16 train float32 parameters with the forward under ``torch.autocast``
(mixed precision as it is usually run): the fused op's convolution runs in the 16-bit
type, and the gradients and the optimizer step are float32, as in the single process.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from .modules import ConvTranspose3dReLUGroupNorm
from .ops import explain

SAMPLES_PER_PROCESS = 2
LEARNING_RATE = 0.05

# Largest difference allowed between a gradient and the single process's, as a fraction of
# that gradient's largest magnitude. The two runs add the same per-sample terms in another
# order: each process sums its share of the batch, the all-reduce (DDP) or reduce-scatter
# (FSDP2) adds the shares. In float32 only that order differs: a few float32 epsilons
# (2^-23) on the CPU; 1e-5 leaves room for cuDNN picking another algorithm for the smaller
# batch. Under autocast the op's weight and bias gradients are rounded to the 16-bit type
# on each share before the reduction and once in the single process, each rounding half an
# epsilon (2^-10 for float16, 2^-7 for bfloat16) of the shares' magnitudes, which exceed
# the whole batch's where the shares cancel; another tiling of the smaller batch may also
# round a few outputs of the forward the other way. Under one epsilon measured on the CPU;
# 8 epsilons allowed, far below the error of a share left out or counted twice.
GRADIENT_TOLERANCE = {torch.float32: 1e-5, torch.float16: 8 * 2**-10, torch.bfloat16: 8 * 2**-7}


def decoder(device: torch.device) -> nn.Sequential:
    """A kernel-3 stride-1 and a kernel-2 stride-2 fused block (conv bias, affine GroupNorm,
    channel counts multiples of 8, so that the fused sm90 path takes both in 16-bit) and
    a 1x1x1 convolution to one channel, with the same initial parameters in every process."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = nn.Sequential(ConvTranspose3dReLUGroupNorm(16, 16, 3, 4, bias=True, padding=1),
                              ConvTranspose3dReLUGroupNorm(16, 8, 2, 2, bias=True, stride=2),
                              nn.Conv3d(8, 1, 1))
    return model.to(device)


def batches(steps: int, world_size: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    """One (input, target) batch of SAMPLES_PER_PROCESS samples per process for each step,
    the same in every process."""
    generator = torch.Generator().manual_seed(1)
    size = SAMPLES_PER_PROCESS * world_size
    return [(torch.randn(size, 16, 4, 4, 4, generator=generator).to(device),
             torch.randn(size, 1, 8, 8, 8, generator=generator).to(device)) for _ in range(steps)]


def distribute(model: nn.Module, mode: str, device: torch.device) -> nn.Module:
    """The model under DistributedDataParallel, or sharded by FSDP2: each fused block one
    parameter group, the root module the rest."""
    if mode == "DDP":
        return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    if mode == "FSDP2":
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model:
            if isinstance(block, ConvTranspose3dReLUGroupNorm):
                fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)
    raise ValueError(f"cutlassfuse: mode must be 'DDP' or 'FSDP2', got {mode!r}")


def full(tensor: Tensor) -> Tensor:
    """A float32 CPU copy of the whole tensor (FSDP2's shards gathered: a collective)."""
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", torch.float32, copy=True)


@dataclass
class Step:
    gradients: list[Tensor]  # after the backward
    parameters: list[Tensor]  # after the optimizer step


def forward_loss(model: nn.Module, x: Tensor, target: Tensor, dtype: torch.dtype) -> Tensor:
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32):
        out = model(x)
    return F.mse_loss(out.float(), target)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, target: Tensor,
               dtype: torch.dtype) -> Step:
    optimizer.zero_grad()
    forward_loss(model, x, target, dtype).backward()
    gradients = [full(p.grad) for p in model.parameters()]
    optimizer.step()
    return Step(gradients, [full(p) for p in model.parameters()])


@dataclass(frozen=True)
class Comparison:
    """One step of one process's data-parallel run against the single process."""

    mode: str
    dtype: str
    step: int
    parameter_difference: float  # max abs over every parameter
    gradient_difference: float
    of_tolerance: float  # the largest difference / its tolerance over every tensor: at most 1 passes

    @property
    def passed(self) -> bool:
        return self.of_tolerance <= 1.0


def max_difference(a: Tensor, b: Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def of_tolerance(difference: float, tolerance: float) -> float:
    if tolerance > 0:
        return difference / tolerance
    return 0.0 if difference == 0 else math.inf


def compare(mode: str, dtype: torch.dtype, step: int, ours: Step, single: Step) -> Comparison:
    """Gradients within GRADIENT_TOLERANCE of the single process's. Both steps start from
    the same parameters, and plain SGD moves each by -LEARNING_RATE x its gradient,
    rounded to float32: the parameters after the step may differ by LEARNING_RATE x the
    gradient's tolerance plus one float32 rounding of each run's update."""
    ratio = 0.0
    for got, want, got_parameter, want_parameter in zip(ours.gradients, single.gradients, ours.parameters,
                                                        single.parameters, strict=True):
        gradient_tolerance = GRADIENT_TOLERANCE[dtype] * want.abs().max().item()
        parameter_tolerance = (LEARNING_RATE * gradient_tolerance
                               + torch.finfo(torch.float32).eps * want_parameter.abs().max().item())
        ratio = max(ratio, of_tolerance(max_difference(got, want), gradient_tolerance),
                    of_tolerance(max_difference(got_parameter, want_parameter), parameter_tolerance))
    return Comparison(mode, str(dtype).removeprefix("torch."), step,
                      max(map(max_difference, ours.parameters, single.parameters)),
                      max(map(max_difference, ours.gradients, single.gradients)), ratio)


def compare_steps(mode: str, dtype: torch.dtype, device: torch.device, whole: Sequence[tuple[Tensor, Tensor]],
                  share: slice) -> list[Comparison]:
    """The decoder trained by `mode` on this process's share of each batch, step by step
    against one process taking the same step on the whole batch from the same parameters.

    Every step starts the single process from the data-parallel run's parameters (plain SGD
    keeps no other state), so that each step is compared on its own: in 16-bit, parameters
    a float32 rounding apart can cast to neighbouring 16-bit values, and two runs left to
    themselves drift apart by more than one step's summation order."""
    model, single = distribute(decoder(device), mode, device), decoder(device)
    optimizer, single_optimizer = (torch.optim.SGD(m.parameters(), lr=LEARNING_RATE) for m in (model, single))
    rows = []
    for step, (x, target) in enumerate(whole, start=1):
        with torch.no_grad():  # an in-place copy: the fused blocks' packed weights see the new version
            for parameter, source in zip(single.parameters(), model.parameters(), strict=True):
                parameter.copy_(full(source))
        ours = train_step(model, optimizer, x[share], target[share], dtype)
        rows.append(compare(mode, dtype, step, ours, train_step(single, single_optimizer, x, target, dtype)))
    return rows


def compare_with_one_process(device: torch.device, modes: Sequence[str], dtypes: Sequence[torch.dtype],
                             steps: int) -> list[Comparison]:
    """In every process of the initialized default process group (a device each, or
    processes sharing one): each mode and dtype, `steps` steps (compare_steps)."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    whole = batches(steps, world_size, device)
    share = slice(rank * SAMPLES_PER_PROCESS, (rank + 1) * SAMPLES_PER_PROCESS)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return [row for dtype in dtypes for mode in modes for row in compare_steps(mode, dtype, device, whole, share)]


def fused_paths(device: torch.device, dtype: torch.dtype) -> list[str]:
    """Which implementation each fused block of the decoder takes in this dtype (under
    autocast the op's input, weight and bias run in the 16-bit type): the part of
    ``explain``'s answer before its colon."""
    x = batches(1, 1, device)[0][0].to(dtype)
    paths = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        for block in decoder(device):
            if isinstance(block, ConvTranspose3dReLUGroupNorm):
                conv, norm = block.conv_transpose, block.group_norm
                answer = explain(x, conv.weight.to(dtype), conv.bias.to(dtype), conv.stride, conv.padding,
                                 conv.output_padding, conv.groups, conv.dilation, num_groups=norm.num_groups,
                                 norm_weight=norm.weight, norm_bias=norm.bias, eps=norm.eps)
                paths.append(answer.split(":")[0])
            x = block(x)
    return paths


def worst_over_processes(per_process: Sequence[Sequence[Comparison]]) -> list[Comparison]:
    """Each row with the largest differences any process saw."""
    return [max(rows, key=lambda row: row.of_tolerance) for rows in zip(*per_process, strict=True)]


def format_table(rows: Sequence[Comparison]) -> str:
    lines = [f"{'mode':<7}{'dtype':<10}{'step':>5}{'param diff':>13}{'grad diff':>12}{'diff/tol':>10}  result"]
    for row in rows:
        lines.append(f"{row.mode:<7}{row.dtype:<10}{row.step:>5}{row.parameter_difference:>13.2e}"
                     f"{row.gradient_difference:>12.2e}{row.of_tolerance:>10.3g}  {'PASS' if row.passed else 'FAIL'}")
    return "\n".join(lines)


def run_data_parallel_check(modes: Sequence[str], dtypes: Sequence[torch.dtype], steps: int,
                            device_type: str) -> int:
    """One process of ``torchrun --nproc-per-node N -m cutlassfuse data-parallel``: NCCL
    with a GPU per process (device_type "cuda"), or gloo on the CPU. The first process
    prints the table; every process returns 0 when each row passes, else 1."""
    world_size, rank, local_rank = (int(os.environ[name]) for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"))
    if world_size < 2:
        raise ValueError(f"cutlassfuse data-parallel: needs at least 2 processes (torchrun --nproc-per-node 2), got "
                         f"{world_size}")
    if device_type == "cuda":
        processes_here, gpus = int(os.environ["LOCAL_WORLD_SIZE"]), torch.cuda.device_count()
        if gpus < processes_here:
            raise ValueError(f"cutlassfuse data-parallel: one GPU per process, {processes_here} processes on this "
                             f"host and {gpus} CUDA GPU(s); --device cpu runs it with gloo on the CPU")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        where = f"NCCL, one {torch.cuda.get_device_name(device)} each"
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        where = "gloo, on the CPU"
    try:
        rows = compare_with_one_process(device, modes, dtypes, steps)
        per_process = [None] * world_size
        dist.all_gather_object(per_process, rows)
    finally:
        dist.destroy_process_group()
    worst = worst_over_processes(per_process)
    if rank == 0:
        print(f"cutlassfuse data-parallel: {world_size} processes, {where}; {steps} SGD steps of "
              f"{SAMPLES_PER_PROCESS} samples per process against one process on all "
              f"{SAMPLES_PER_PROCESS * world_size}")
        print("fused blocks: " + "; ".join(f"{str(d).removeprefix('torch.')} {', '.join(fused_paths(device, d))}"
                                           for d in dtypes))
        print("float16/bfloat16: float32 parameters, forward under torch.autocast; float32: TF32 off\n")
        print(format_table(worst))
    return 0 if all(row.passed for row in worst) else 1
