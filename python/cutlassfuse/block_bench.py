"""The block family on the blocks of real 3D networks: each as the torch.nn modules a
network holds (eager, and torch.compile of them) against the cutlassfuse module built
from those very modules (``from_modules``), beside the floor of any implementation that
runs cuDNN's convolution and then writes the block's output once: cuDNN's convolution
alone (F.conv3d / F.conv_transpose3d with its bias) plus one copy of a tensor of the
output's size. The standalone norm's floor is one copy of its input.

    python benchmarks/blocks.py [--blocks basicunet_conv,kb61] [--dtypes float16,bfloat16] [--no-compile] [--train]
    python -m cutlassfuse bench --blocks all [--train]                    # the same, from the installed package
    python benchmarks/blocks.py --device cpu --tiny --dtypes float32 --no-compile   # checks the script without a GPU

Per block, dtype and memory format (NCDHW and channels_last_3d inputs): the median ms of
each implementation, the median over alternating rounds (so that clock and host drift
fall on all of them) of one round's median of `--repeats` calls between CUDA events,
every call reading the next of fresh torch.rand input copies (`bench.time_rotating`);
cutlassfuse's time over the floor's, eager's and torch.compile's over cutlassfuse's;
the max abs error of eager and cutlassfuse against a float64 copy of the eager modules
on the same input. kb61 (KernelBench level2/61, ReLU before GroupNorm) also times the
existing ConvTranspose3dReLUGroupNorm on the same modules. ``--train`` adds a training
step of eager and cutlassfuse (forward, and backward of the output's sum to the input
and every parameter). Rows that miss a target are flagged.
"""

from __future__ import annotations

import copy
import csv
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch._prims_common import suggest_memory_format

from cutlassfuse import (
    Conv3dNormActivation,
    ConvTranspose3dNormActivation,
    ConvTranspose3dReLUGroupNorm,
    GroupNormActivation,
)
from cutlassfuse.bench import parse_shape, rotating_tensors, time_rotating

WARMUP = 3


@dataclass(frozen=True)
class Targets:
    max_over_floor: float  # cutlassfuse's time over the floor's, at most
    min_over_eager: float  # eager's time over cutlassfuse's, at least (and torch.compile's above 1)


CONV_TARGETS = Targets(max_over_floor=1.1, min_over_eager=1.75)
NORM_TARGETS = Targets(max_over_floor=1.3, min_over_eager=20.0)
# A call in grad mode (parameters requiring grad, no backward) against the same call under
# torch.no_grad(), at most; and faster than eager's in grad mode.
MAX_GRAD_MODE_OVER_NO_GRAD = 1.1


@dataclass(frozen=True)
class Conv:
    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    output_padding: int = 0
    bias: bool = True
    transposed: bool = False


@dataclass(frozen=True)
class Block:
    """One block: the conv (None for the norm and its activation alone) of an input
    (batch, in_channels, *size), the norm (GroupNorm with ``num_groups``, else
    InstanceNorm3d) and the activation module, after the norm or before it."""

    name: str
    batch: int
    in_channels: int
    size: tuple[int, int, int]
    conv: Conv | None
    num_groups: int | None
    affine: bool
    activation: Callable[[], nn.Module]
    activation_before_norm: bool = False
    existing_op: bool = False  # ConvTranspose3dReLUGroupNorm computes it too
    # cutlassfuse's time over torch.compile's, below this: 1 (faster), or more where the
    # convolution alone takes nearly all of the block's time (torch.compile calls cuDNN's)
    max_over_compile: float = 1.0

    @property
    def channels(self) -> int:
        """The norm's channels."""
        return self.conv.out_channels if self.conv else self.in_channels

    @property
    def targets(self) -> Targets:
        return CONV_TARGETS if self.conv else NORM_TARGETS

    def tiny(self) -> Block:
        """The same block at a size for checking the script (CPU, CI): one sample, a
        quarter of the channels (whole GroupNorm groups), an eighth of the extent."""
        groups = self.num_groups or 1

        def fewer(channels: int) -> int:
            return max(groups, channels // 4 // groups * groups)

        conv = replace(self.conv, out_channels=fewer(self.conv.out_channels)) if self.conv else None
        return replace(self, name=f"{self.name}-tiny", batch=1,
                       in_channels=max(1, self.in_channels // 4) if self.conv else fewer(self.in_channels),
                       size=tuple(max(2, s // 8) for s in self.size), conv=conv)


def kernelbench_block() -> Block:
    """KernelBench level2/61 as `cutlassfuse.bench` runs it: ConvTranspose3d with its
    default bias, ReLU, GroupNorm."""
    shape = parse_shape("kb61")
    conv = Conv(shape.out_channels, shape.kernel, shape.stride, shape.padding, shape.output_padding, transposed=True)
    return Block(shape.name, shape.batch, shape.in_channels, shape.size, conv, shape.groups, True, nn.ReLU,
                 activation_before_norm=True, existing_op=True)


# The conv blocks of MONAI's BasicUNet, DynUNet, UNet (down and up) and SegResNet and of an
# autoencoder decoder's upsampler (GroupNorm(32), SiLU); SegResNet's norm and activation
# alone; KernelBench level2/61.
BLOCKS = [
    Block("basicunet_conv", 1, 32, (128, 128, 128), Conv(32, 3, padding=1), None, True, lambda: nn.LeakyReLU(0.1),
          max_over_compile=1.1),
    Block("dynunet_conv", 2, 64, (48, 48, 48), Conv(64, 3, padding=1, bias=False), None, True,
          lambda: nn.LeakyReLU(0.01)),
    Block("unet_down", 2, 16, (48, 48, 48), Conv(32, 3, stride=2, padding=1), None, False, nn.PReLU),
    Block("unet_up", 2, 128, (12, 12, 12), Conv(32, 3, stride=2, padding=1, output_padding=1, transposed=True), None,
          False, nn.PReLU),
    Block("segres_conv", 1, 32, (64, 64, 64), Conv(32, 3, padding=1, bias=False), 8, True, nn.ReLU),
    Block("upsampler_conv", 1, 256, (8, 32, 32), Conv(256, 3, padding=1), 32, True, nn.SiLU),
    Block("segres_norm", 1, 16, (128, 128, 128), None, 8, True, nn.ReLU),
    kernelbench_block(),
]
BLOCK_NAMES = tuple(block.name for block in BLOCKS)


def models(block: Block, dtype: torch.dtype, device: torch.device) -> dict[str, nn.Module]:
    """The block's torch.nn modules in a row ("eager"), the cutlassfuse module holding
    them ("cutlassfuse") and, where it computes the block, the existing op's module."""
    torch.manual_seed(0)
    channels = block.channels
    if block.num_groups is None:
        norm = nn.InstanceNorm3d(channels, affine=block.affine)
    else:
        norm = nn.GroupNorm(block.num_groups, channels, affine=block.affine)
    activation = block.activation()
    if block.conv is None:
        eager = nn.Sequential(norm, activation).to(device=device, dtype=dtype).eval()
        return {"eager": eager, "cutlassfuse": GroupNormActivation.from_modules(norm, activation)}
    c = block.conv
    if c.transposed:
        conv = nn.ConvTranspose3d(block.in_channels, c.out_channels, c.kernel, stride=c.stride, padding=c.padding,
                                  output_padding=c.output_padding, bias=c.bias)
    else:
        conv = nn.Conv3d(block.in_channels, c.out_channels, c.kernel, stride=c.stride, padding=c.padding, bias=c.bias)
    layers = (conv, activation, norm) if block.activation_before_norm else (conv, norm, activation)
    eager = nn.Sequential(*layers).to(device=device, dtype=dtype).eval()
    fused_class = ConvTranspose3dNormActivation if c.transposed else Conv3dNormActivation
    result = {"eager": eager, "cutlassfuse": fused_class.from_modules(
        conv, norm, activation, activation_before_norm=block.activation_before_norm)}
    if block.existing_op:
        result["existing op"] = ConvTranspose3dReLUGroupNorm.from_modules(conv, norm)
    return result


def conv_alone(conv: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """cuDNN's convolution of the block, with its bias."""
    if isinstance(conv, nn.ConvTranspose3d):
        return lambda x: F.conv_transpose3d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.output_padding,
                                            conv.groups, conv.dilation)
    return lambda x: F.conv3d(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)


def training_step(model: nn.Module) -> Callable[[torch.Tensor], None]:
    """Forward, then backward of the output's sum to the input and every parameter."""

    def step(x: torch.Tensor) -> None:
        x.grad = None
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    return step


@dataclass(frozen=True)
class Timed:
    fn: Callable[[torch.Tensor], object]
    inputs: list[torch.Tensor]
    grad_mode: bool = False  # called with autograd on, else under torch.no_grad()


def timed_calls(block: Block, blocks: dict[str, nn.Module], inputs: list[torch.Tensor], output: torch.Tensor, *,
                with_compile: bool, train: bool) -> dict[str, Timed]:
    """What one case times: one copy of the output, the conv alone, eager, torch.compile,
    cutlassfuse, the existing op's module; with ``train`` the training steps."""
    copies = rotating_tensors(tuple(output.shape), output.dtype, output.device, suggest_memory_format(output))
    calls = {"copy": Timed(torch.clone, copies)}
    if block.conv:
        calls["conv"] = Timed(conv_alone(blocks["eager"][0]), inputs)
    calls["eager"] = Timed(blocks["eager"], inputs)
    if with_compile:
        torch._dynamo.reset()  # every case compiles afresh instead of piling up recompilations
        calls["compile"] = Timed(torch.compile(blocks["eager"]), inputs)
    calls["cutlassfuse"] = Timed(blocks["cutlassfuse"], inputs)
    if "existing op" in blocks:
        calls["existing op"] = Timed(blocks["existing op"], inputs)
    # Called as most scripts do: parameters that require grad, no torch.no_grad(), no backward.
    calls["eager grad mode"] = Timed(blocks["eager"], inputs, grad_mode=True)
    calls["cutlassfuse grad mode"] = Timed(blocks["cutlassfuse"], inputs, grad_mode=True)
    if train:
        leaves = [x.detach().requires_grad_() for x in inputs]
        for name in ("eager", "cutlassfuse", "existing op"):
            if name in blocks:
                calls[f"{name} train"] = Timed(training_step(blocks[name]), leaves, grad_mode=True)
    return calls


def medians_over_rounds(calls: dict[str, Timed], rounds: int, repeats: int) -> tuple[dict[str, float], dict[str, str]]:
    """Per call: the median over alternating rounds of each round's median ms; and why
    the calls that raise on their first try (a refused problem, a failed compilation)
    are left out."""
    refused = {}
    for name, call in calls.items():
        try:
            with torch.set_grad_enabled(call.grad_mode):
                call.fn(call.inputs[0])
        except (RuntimeError, ValueError) as error:
            refused[name] = str(error).splitlines()[0]
    samples: dict[str, list[float]] = {name: [] for name in calls if name not in refused}
    for _ in range(rounds):
        for name in samples:
            with torch.set_grad_enabled(calls[name].grad_mode):
                samples[name].append(time_rotating(calls[name].fn, calls[name].inputs, WARMUP, repeats).median_ms)
    return {name: statistics.median(values) for name, values in samples.items()}, refused


@dataclass
class Row:
    """One case; times in ms, None where the implementation does not apply or refused
    (`notes` says which refused and why)."""

    block: str
    dtype: str
    memory_format: str
    copy_ms: float | None
    conv_ms: float | None
    eager_ms: float | None
    compile_ms: float | None
    cutlassfuse_ms: float | None
    existing_op_ms: float | None
    over_floor: float | None  # cutlassfuse / (conv + copy); the norm alone: cutlassfuse / copy
    eager_over_cutlassfuse: float | None
    compile_over_cutlassfuse: float | None
    eager_train_ms: float | None
    cutlassfuse_train_ms: float | None
    existing_op_train_ms: float | None
    train_eager_over_cutlassfuse: float | None
    eager_max_abs: float | None  # against the float64 modules
    cutlassfuse_max_abs: float | None
    existing_op_max_abs: float | None
    eager_grad_mode_ms: float | None  # parameters requiring grad, no backward
    cutlassfuse_grad_mode_ms: float | None
    grad_mode_over_no_grad: float | None  # cutlassfuse's
    grad_mode_eager_over_cutlassfuse: float | None
    path: str  # the kernel path of cutlassfuse's call under torch.no_grad() (explain()'s prefix)
    grad_mode_path: str  # in grad mode
    misses: str
    notes: str


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or denominator is None else numerator / denominator


def max_abs_errors(blocks: dict[str, nn.Module], x: torch.Tensor) -> dict[str, float | None]:
    """Each module's max abs error against a float64 copy of the eager modules on `x`;
    None where the module refuses `x`."""
    reference_model = copy.deepcopy(blocks["eager"]).double()
    errors = {}
    with torch.no_grad():
        reference = reference_model(x.double())
        for name, model in blocks.items():
            try:
                errors[name] = (model(x).double() - reference).abs().max().item()
            except (RuntimeError, ValueError):  # medians_over_rounds reports why
                errors[name] = None
    return errors


def kernel_path(blocks: dict[str, nn.Module], x: torch.Tensor, *, grad_mode: bool) -> str:
    """The kernel path cutlassfuse's module takes for ``x`` in grad mode or under
    torch.no_grad()."""
    with torch.set_grad_enabled(grad_mode):
        return blocks["cutlassfuse"].explain(x).split(":")[0]


def misses(block: Block, row: Row) -> str:
    targets = block.targets
    if row.cutlassfuse_ms is None:
        return "cutlassfuse refused"
    found = []
    if row.over_floor is not None and row.over_floor > targets.max_over_floor:
        found.append(f"over floor > {targets.max_over_floor}")
    if row.eager_over_cutlassfuse is not None and row.eager_over_cutlassfuse < targets.min_over_eager:
        found.append(f"eager/cf < {targets.min_over_eager}")
    if row.compile_over_cutlassfuse is not None and 1 / row.compile_over_cutlassfuse >= block.max_over_compile:
        found.append("not faster than compile" if block.max_over_compile == 1.0 else
                     f"over compile >= {block.max_over_compile}")
    if row.grad_mode_over_no_grad is not None and row.grad_mode_over_no_grad > MAX_GRAD_MODE_OVER_NO_GRAD:
        found.append(f"grad mode / no_grad > {MAX_GRAD_MODE_OVER_NO_GRAD}")
    if row.grad_mode_eager_over_cutlassfuse is not None and row.grad_mode_eager_over_cutlassfuse <= 1.0:
        found.append("grad mode not faster than eager's")
    return "; ".join(found)


def run_case(block: Block, dtype: torch.dtype, memory_format: str, device: torch.device, *, with_compile: bool,
             train: bool, rounds: int, repeats: int) -> Row:
    blocks = models(block, dtype, device)
    layout = torch.channels_last_3d if memory_format == "channels_last" else torch.contiguous_format
    inputs = rotating_tensors((block.batch, block.in_channels, *block.size), dtype, device, layout)
    with torch.no_grad():
        output = blocks["eager"](inputs[0])
    ms, refused = medians_over_rounds(timed_calls(block, blocks, inputs, output, with_compile=with_compile,
                                                  train=train), rounds, repeats)
    errors = max_abs_errors(blocks, inputs[0])
    floor = ms["copy"] + ms["conv"] if block.conv else ms["copy"]
    cutlassfuse_ms = ms.get("cutlassfuse")
    row = Row(block.name, str(dtype).removeprefix("torch."), memory_format, ms["copy"], ms.get("conv"),
              ms.get("eager"), ms.get("compile"), cutlassfuse_ms, ms.get("existing op"),
              ratio(cutlassfuse_ms, floor), ratio(ms.get("eager"), cutlassfuse_ms),
              ratio(ms.get("compile"), cutlassfuse_ms), ms.get("eager train"), ms.get("cutlassfuse train"),
              ms.get("existing op train"), ratio(ms.get("eager train"), ms.get("cutlassfuse train")),
              errors["eager"], errors["cutlassfuse"], errors.get("existing op"), ms.get("eager grad mode"),
              ms.get("cutlassfuse grad mode"), ratio(ms.get("cutlassfuse grad mode"), cutlassfuse_ms),
              ratio(ms.get("eager grad mode"), ms.get("cutlassfuse grad mode")),
              kernel_path(blocks, inputs[0], grad_mode=False), kernel_path(blocks, inputs[0], grad_mode=True),
              misses="",
              notes="; ".join(f"{name} refused: {why}" for name, why in refused.items()))
    row.misses = misses(block, row)
    return row


COLUMNS = [  # heading, width, the row's field, its format
    ("block", 22, "block", "s"), ("dtype", 9, "dtype", "s"), ("layout", 14, "memory_format", "s"),
    ("copy", 8, "copy_ms", ".3f"), ("conv", 8, "conv_ms", ".3f"), ("eager", 8, "eager_ms", ".3f"),
    ("compile", 8, "compile_ms", ".3f"), ("cf", 8, "cutlassfuse_ms", ".3f"), ("existing", 9, "existing_op_ms", ".3f"),
    ("cf/floor", 9, "over_floor", ".2f"), ("eager/cf", 9, "eager_over_cutlassfuse", ".2f"),
    ("comp/cf", 8, "compile_over_cutlassfuse", ".2f"), ("err eager", 10, "eager_max_abs", ".1e"),
    ("err cf", 9, "cutlassfuse_max_abs", ".1e"), ("path", 11, "path", "s"), ("eager g", 8, "eager_grad_mode_ms", ".3f"),
    ("cf g", 8, "cutlassfuse_grad_mode_ms", ".3f"), ("g/ng", 6, "grad_mode_over_no_grad", ".2f"),
    ("e/cf g", 7, "grad_mode_eager_over_cutlassfuse", ".2f"), ("path g", 11, "grad_mode_path", "s"),
]
TRAIN_COLUMNS = [("eager trn", 10, "eager_train_ms", ".3f"), ("cf trn", 8, "cutlassfuse_train_ms", ".3f"),
                 ("trn e/cf", 9, "train_eager_over_cutlassfuse", ".2f")]


def print_row(row: Row, columns: list[tuple[str, int, str, str]]) -> None:
    cells = []
    for _, width, field, spec in columns:
        value = getattr(row, field)
        text = "-" if value is None else format(value, spec)
        cells.append(text.ljust(width) if spec == "s" else text.rjust(width))
    flags = f"  <- MISS: {row.misses}" if row.misses else ""
    notes = f"  ({row.notes})" if row.notes else ""
    print("".join(cells) + flags + notes, flush=True)


def run_table(cases: list, dtypes: list[torch.dtype], memory_formats: list[str],
              columns: list[tuple[str, int, str, str]], csv_path: str | None, run: Callable) -> list:
    """Prints the columns' headings, then the row `run(case, dtype, memory_format)` gives for
    each combination as it comes, then how many rows miss a target; writes the rows (those
    of a dataclass with a ``misses`` field) to ``csv_path``."""
    print("".join(heading.ljust(width) if spec == "s" else heading.rjust(width)
                  for heading, width, _, spec in columns))
    start = time.perf_counter()
    rows = []
    for case in cases:
        for dtype in dtypes:
            for memory_format in memory_formats:
                rows.append(run(case, dtype, memory_format))
                print_row(rows[-1], columns)
    missed = sum(bool(row.misses) for row in rows)
    print(f"{missed} of {len(rows)} rows miss a target; {time.perf_counter() - start:.0f} s")
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(row) for row in rows)
    return rows


def run_block_bench(block_names: list[str], dtypes: list[torch.dtype], memory_formats: list[str], *,
                    with_compile: bool = True, train: bool = False, repeats: int = 20, rounds: int = 5,
                    csv_path: str | None = None, device: str = "cuda", tiny: bool = False) -> list[Row]:
    """Times the named blocks (BLOCK_NAMES, or "all") in each dtype and input memory
    format ("ncdhw", "channels_last"), prints the table and writes the rows to ``csv_path``."""
    unknown = set(block_names) - {"all", *BLOCK_NAMES}
    if unknown:
        raise SystemExit(f"cutlassfuse: unknown blocks {', '.join(sorted(unknown))}; known: {', '.join(BLOCK_NAMES)}")
    where_to_run = torch.device(device)
    if where_to_run.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cutlassfuse: no CUDA device (`--device cpu --tiny` checks the block benchmark on the CPU)")
    blocks = [block for block in BLOCKS if block.name in block_names or "all" in block_names]
    blocks = [block.tiny() for block in blocks] if tiny else blocks
    columns = COLUMNS + (TRAIN_COLUMNS if train else [])
    where = torch.cuda.get_device_name() if where_to_run.type == "cuda" else "CPU"
    print(f"{where}, torch {torch.__version__}; median ms; floor: cuDNN conv + one copy of the output (the norm "
          f"alone: one copy); targets: cf/floor <= {CONV_TARGETS.max_over_floor} ({NORM_TARGETS.max_over_floor} for "
          f"the norm alone), eager/cf >= {CONV_TARGETS.min_over_eager} ({NORM_TARGETS.min_over_eager}), comp/cf > 1, "
          f"g/ng <= {MAX_GRAD_MODE_OVER_NO_GRAD} and e/cf g > 1 (g: in grad mode, parameters requiring grad and no "
          "backward); err: max abs against the float64 modules")
    return run_table(blocks, dtypes, memory_formats, columns, csv_path, lambda block, dtype, memory_format: run_case(
        block, dtype, memory_format, where_to_run, with_compile=with_compile, train=train, rounds=rounds,
        repeats=repeats))
