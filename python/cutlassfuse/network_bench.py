"""Whole MONAI networks through `cutlassfuse.fuse`: each network at MONAI's default
arguments (those it requires as in NETWORKS) against the model fuse() makes of a deep
copy of it, with and without torch.compile. Needs MONAI (pip install monai), imported
when the benchmark runs.

    python -m cutlassfuse bench --networks [unet,basicunet] [--dtypes float16,bfloat16] [--memory-formats ncdhw]
                                [--no-compile] [--train] [--repeats 10] [--rounds 5] [--csv networks.csv]
    python benchmarks/networks.py [--networks unet,basicunet] ...                    # the same
    python -m cutlassfuse bench --networks --device cpu --tiny --dtypes float32 --no-compile   # checks it without a GPU

Per network, dtype and memory format (NCDHW, or the model and its input in
channels_last_3d), in eval mode under torch.no_grad(): the median ms of eager,
torch.compile of the network, the fused model and torch.compile of the fused model, and on
the GPU the fused model replaying CUDA graphs (``CUDAGraphed``) and torch.compile's
mode="reduce-overhead" (Inductor's kernels replayed from CUDA graphs), each
the median over alternating rounds (so that clock and host drift fall on all of them)
of one round's median of `--repeats` calls between CUDA events, every call reading the
next of fresh torch.rand input copies (`bench.time_rotating`); the fused model's time
over eager's and torch.compile's, and compile(fused)'s over the fused model's; how
many chains fuse() replaced and left alone; the max abs error of eager and the fused
model against a float64 copy of the network on one input; the kernel time per call of
eager and the fused model split into convolutions, norms (the fused model's norm
kernels apply its activations too) and everything else (torch.profiler; on the CPU
each op's own time); the case's wall time, compilations included. MONAI's dropouts
are p=0 at these arguments, so fuse() passes them through. Eager and the fused model
are timed in grad mode too, as most scripts call a model: eval mode, parameters that
require grad, no torch.no_grad(), no backward.

``train=True`` (``--train``) adds, in train mode, the training step of eager and of the
fused model (forward, and backward of the output's mean to every parameter), and the
error of their parameter gradients against the float64 network's: eager, the fused
model and a float64 copy of the network each run forward on the same inputs (three
fresh ones on the GPU) and backward from the same output gradient g, the gradient of sum(output * g), with g
standard normal values over sqrt(output.numel()) (parameter gradients of order one; the
mean's 1/numel would underflow in float16) rounded to the dtype, so that the float64
network backpropagates the very same values. Each parameter is found by its key in the
original network's state_dict, which the fused model's state_dict keeps (fuse() maps
the parameters its blocks hold back to the keys of the modules they came from). The
gradient error is the max abs difference from the float64 gradients over all
parameters' gradients together, the largest over the inputs (one input's max abs error
in float16 hangs on the rounding of a few elements), the same for eager and the fused
model, and grad f/e is the fused model's over eager's.

A row's ``misses`` names each target the case misses: the fused model faster than
torch.compile of the network, BasicUNet and SegResNet 3x faster than eager,
compile(fused) no slower than the fused model, the fused model's output error within
eager's, its grad-mode forward within 1.1x its no_grad one and faster than eager's grad-mode
forward, its training step faster than eager's, its gradient error within 1.25x eager's.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import ModuleType

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from .bench import rotating_tensors

# The block benchmark's timing, errors and table rows.
from .block_bench import MAX_GRAD_MODE_OVER_NO_GRAD, Timed, max_abs_errors, medians_over_rounds, ratio, run_table
from .cuda_graphs import CUDAGraphed
from .rewrite import FuseResult, fuse

PROFILED_CALLS = 3
MAX_GRADIENT_ERROR_OVER_EAGER = 1.25  # the fused model's gradient error over eager's, at most
# Inputs the gradient errors take the largest error over: the max abs error of a float16
# gradient hangs on the rounding of a few elements, and one input decides it by chance.
GRADIENT_INPUTS = 3
# A kernel's class by its name (lower case): convolutions (cuDNN's, CUTLASS's), then norms
# (ATen's GroupNorm and the batch norm that InstanceNorm3d runs, cuDNN's batch norm, the
# cutlassfuse norm kernels), then cuDNN's other kernels (its layout transforms around a
# convolution); everything else is "other".
CONV_KEYS = ("conv", "xmma", "implicit_gemm", "dgrad", "fprop", "wgrad")
NORM_KEYS = ("norm", "instance", "welford", "finalize", "moments", "fusedparams", "bn_fw", "bn_bw")
KERNEL_CLASSES = ("conv", "norm", "other")


def monai_networks() -> ModuleType:
    """monai.networks.nets, or SystemExit saying that the benchmark needs MONAI."""
    try:
        from monai.networks import nets
    except ImportError as error:
        raise SystemExit(f"cutlassfuse: the networks benchmark needs MONAI (pip install monai): {error}") from error
    return nets


@dataclass(frozen=True)
class Network:
    """A network of monai.networks.nets with its arguments, on input (batch,
    in_channels, size, size, size); `tiny_arguments` override arguments in the tiny mode."""

    name: str
    monai_class: str
    arguments: dict = field(hash=False)
    batch: int
    size: int
    tiny_arguments: dict = field(hash=False)
    tiny_size: int = 16
    min_eager_over_fused: float | None = None  # eager's time over the fused model's, at least

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.batch, self.arguments["in_channels"], self.size, self.size, self.size)

    def build(self) -> nn.Module:
        return getattr(monai_networks(), self.monai_class)(**self.arguments)

    def tiny(self) -> Network:
        """The same network with a few channels (and levels) on one small sample, for
        checking the benchmark (CPU, CI)."""
        return replace(self, name=f"{self.name}-tiny", arguments={**self.arguments, **self.tiny_arguments}, batch=1,
                       size=self.tiny_size)


NETWORKS = [
    Network("unet", "UNet", dict(spatial_dims=3, in_channels=1, out_channels=2, channels=(16, 32, 64, 128, 256),
                                 strides=(2, 2, 2, 2), num_res_units=2), 2, 96,
            dict(channels=(4, 8, 8, 16), strides=(2, 2, 2))),
    # BasicUNet's four poolings are fixed: its tiny input is 32^3, so that the deepest
    # InstanceNorm normalizes more than one voxel (which InstanceNorm3d requires).
    Network("basicunet", "BasicUNet", dict(spatial_dims=3, in_channels=1, out_channels=2), 1, 128,
            dict(features=(2, 2, 4, 4, 8, 2)), tiny_size=32, min_eager_over_fused=3.0),
    Network("dynunet", "DynUNet", dict(spatial_dims=3, in_channels=1, out_channels=2, kernel_size=[3] * 5,
                                       strides=[1, 2, 2, 2, 2], upsample_kernel_size=[2, 2, 2, 2]), 2, 96,
            dict(kernel_size=[3] * 4, strides=[1, 2, 2, 2], upsample_kernel_size=[2, 2, 2], filters=[4, 8, 8, 16])),
    Network("segresnet", "SegResNet", dict(spatial_dims=3, init_filters=16, in_channels=1, out_channels=2), 1, 128,
            dict(init_filters=8), min_eager_over_fused=3.0),
]
NETWORK_NAMES = tuple(network.name for network in NETWORKS)


def kernel_class(name: str) -> str:
    lowered = name.lower()
    if any(key in lowered for key in CONV_KEYS):
        return "conv"
    if any(key in lowered for key in NORM_KEYS):
        return "norm"
    return "conv" if "cudnn" in lowered else "other"


def kernel_split_ms(model: nn.Module, inputs: list[torch.Tensor],
                    classify: Callable[[str], str] = kernel_class) -> dict[str, float]:
    """Per call under torch.no_grad(): the CUDA kernel time of each class of kernels
    (`classify` of the kernel's name, `kernel_class` by default); on the CPU each op's own
    time, by the op's name."""
    cuda = inputs[0].is_cuda
    rotation = itertools.cycle(inputs)
    split = dict.fromkeys(KERNEL_CLASSES, 0.0)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(PROFILED_CALLS):
            model(next(rotation))
        if cuda:
            torch.cuda.synchronize()
    device_type = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    for event in prof.events():
        if event.device_type == device_type:
            us = event.device_time if cuda else event.self_cpu_time_total
            name = classify(event.name)
            split[name] = split.get(name, 0.0) + us / 1e3 / PROFILED_CALLS
    return split


def mean_backward_step(model: nn.Module) -> Callable[[torch.Tensor], None]:
    """Forward, then backward of the output's mean to every parameter."""

    def step(x: torch.Tensor) -> None:
        model.zero_grad(set_to_none=True)
        model(x).mean().backward()

    return step


def output_gradient(output: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The output gradient the gradient errors backpropagate: standard normal values
    over sqrt(output.numel()), in `dtype` (seeded: the same for every model)."""
    generator = torch.Generator(output.device).manual_seed(0)
    values = torch.randn(output.shape, generator=generator, dtype=torch.float64, device=output.device)
    return (values / output.numel() ** 0.5).to(dtype)


def parameter_gradients(model: nn.Module, x: torch.Tensor, gradient: torch.Tensor) -> dict[str, torch.Tensor | None]:
    """Forward on `x`, backward from `gradient`; each parameter's gradient (None where
    forward() does not use it) under its key in the state_dict, which for the fused
    model is the original network's key (state_dict(keep_vars=True): the parameters
    themselves)."""
    model.zero_grad(set_to_none=True)
    model(x).backward(gradient)
    return {key: tensor.grad for key, tensor in model.state_dict(keep_vars=True).items()
            if isinstance(tensor, nn.Parameter)}


def max_abs_difference(got: torch.Tensor | None, expected: torch.Tensor) -> float:
    """max |got - expected|, a missing `got` counting as zeros; inf where either holds a
    NaN (which max() would pass over)."""
    difference = expected if got is None else got.double() - expected
    return difference.abs().max().nan_to_num(nan=math.inf).item()


@dataclass(frozen=True)
class GradientError:
    max_abs: float  # over every parameter's gradient, against the float64 network's
    parameter: str  # the state_dict key of the parameter where it is largest


def gradient_errors(models: dict[str, nn.Module], inputs: list[torch.Tensor]) -> dict[str, GradientError | None]:
    """Each train-mode model's parameter gradients against those of a float64 copy of
    ``models["eager"]``, all run on the same inputs and backpropagating the same
    `output_gradient`: each model's largest error over the first GRADIENT_INPUTS of
    `inputs`; None where the model refuses them."""
    reference_model = copy.deepcopy(models["eager"]).double()
    each = [gradient_errors_on(models, reference_model, x) for x in inputs[:GRADIENT_INPUTS]]
    return {name: None if any(errors[name] is None for errors in each)
            else max((errors[name] for errors in each), key=lambda error: error.max_abs) for name in models}


def gradient_errors_on(models: dict[str, nn.Module], reference_model: nn.Module,
                       x: torch.Tensor) -> dict[str, GradientError | None]:
    """gradient_errors on one input."""
    with torch.enable_grad():
        output = reference_model(x.double())
        gradient = output_gradient(output, x.dtype)
        reference_model.zero_grad(set_to_none=True)
        output.backward(gradient.double())
        reference = {key: tensor.grad for key, tensor in reference_model.state_dict(keep_vars=True).items()
                     if isinstance(tensor, nn.Parameter) and tensor.grad is not None}
        errors = {}
        for name, model in models.items():
            try:
                gradients = parameter_gradients(model, x, gradient)
            except (RuntimeError, ValueError):  # medians_over_rounds reports why
                errors[name] = None
                continue
            differences = {key: max_abs_difference(gradients.get(key), expected) for key, expected in reference.items()}
            worst = max(differences, key=differences.__getitem__)
            errors[name] = GradientError(differences[worst], worst)
    return errors


@dataclass
class Models:
    """The network (eval mode), fuse()'s result on a deep copy of it, and with ``train``
    train-mode copies of both."""

    eager: nn.Module
    fused: FuseResult
    train: dict[str, nn.Module]


def models(network: Network, dtype: torch.dtype, device: torch.device, layout: torch.memory_format, *,
           train: bool) -> Models:
    torch.manual_seed(0)
    eager = network.build().to(device=device, dtype=dtype, memory_format=layout).eval()
    fused = fuse(copy.deepcopy(eager))
    trained = {}
    if train:
        trained["eager"] = copy.deepcopy(eager).train()
        trained["fused"] = fuse(copy.deepcopy(trained["eager"])).model
    return Models(eager, fused, trained)


def timed_calls(built: Models, inputs: list[torch.Tensor], *, with_compile: bool) -> dict[str, Timed]:
    """What one case times: eager, torch.compile of the network, the fused model and
    torch.compile of it; the training steps of the train-mode copies."""
    calls = {"eager": Timed(built.eager, inputs)}
    if with_compile:
        torch._dynamo.reset()  # every case compiles afresh instead of piling up recompilations
        calls["compile"] = Timed(torch.compile(built.eager), inputs)
    calls["fused"] = Timed(built.fused.model, inputs)
    if with_compile:
        calls["compile(fused)"] = Timed(torch.compile(built.fused.model), inputs)
    if inputs[0].is_cuda:  # the host's time taken out: CUDA graph replays
        calls["fused+graphs"] = Timed(CUDAGraphed(built.fused.model), inputs)
        if with_compile:
            calls["compile graphs"] = Timed(torch.compile(built.eager, mode="reduce-overhead"), inputs)
    # Called as most scripts do: parameters that require grad, no torch.no_grad(), no backward.
    calls["eager grad mode"] = Timed(built.eager, inputs, grad_mode=True)
    calls["fused grad mode"] = Timed(built.fused.model, inputs, grad_mode=True)
    for name, model in built.train.items():
        calls[f"{name} train"] = Timed(mean_backward_step(model), inputs, grad_mode=True)
    return calls


@dataclass
class Row:
    """One case; times in ms, None where the implementation is not run or refused
    (`notes` says which refused and why, and what fuse() left alone)."""

    network: str
    dtype: str
    memory_format: str
    chains_fused: int  # len(FuseResult.replaced)
    chains_left_alone: int
    eager_ms: float | None
    compile_ms: float | None
    fused_ms: float | None
    compile_fused_ms: float | None
    fused_over_eager: float | None
    fused_over_compile: float | None
    compile_fused_over_fused: float | None
    eager_max_abs: float | None  # against the float64 network
    fused_max_abs: float | None
    eager_grad_mode_ms: float | None  # parameters requiring grad, no backward
    fused_grad_mode_ms: float | None
    grad_mode_fused_over_no_grad: float | None
    grad_mode_fused_over_eager: float | None
    eager_conv_ms: float | None  # kernel time per call by class
    eager_norm_ms: float | None
    eager_other_ms: float | None
    fused_conv_ms: float | None
    fused_norm_ms: float | None
    fused_other_ms: float | None
    eager_train_ms: float | None
    fused_train_ms: float | None
    train_fused_over_eager: float | None
    eager_grad_max_abs: float | None  # parameter gradients against the float64 network's
    fused_grad_max_abs: float | None
    grad_fused_over_eager: float | None
    seconds: float  # the case's wall time, compilations included
    misses: str
    notes: str
    graphed_ms: float | None = None  # the fused model replayed from CUDA graphs (CUDAGraphed)
    compile_graphs_ms: float | None = None  # torch.compile(mode="reduce-overhead"): Inductor and CUDA graphs
    graphed_over_compile: float | None = None
    graphed_over_compile_graphs: float | None = None

    @property
    def eager_split(self) -> str | None:
        return split_text(self.eager_conv_ms, self.eager_norm_ms, self.eager_other_ms)

    @property
    def fused_split(self) -> str | None:
        return split_text(self.fused_conv_ms, self.fused_norm_ms, self.fused_other_ms)


def split_text(*ms: float | None) -> str | None:
    return None if None in ms else "/".join(f"{value:.2f}" for value in ms)


def exceeds(error: float | None, limit: float | None) -> bool:
    """Whether `error` is above `limit` or NaN; False where either is not measured."""
    return error is not None and limit is not None and not error <= limit


def misses(network: Network, row: Row) -> str:
    """The targets the row misses, '; '-separated."""
    if row.fused_ms is None:
        return "fused model refused"
    found = []
    if row.fused_over_compile is not None and row.fused_over_compile >= 1.0:
        found.append("not faster than compile")
    if network.min_eager_over_fused is not None and row.fused_over_eager is not None \
            and row.fused_over_eager * network.min_eager_over_fused > 1.0:
        found.append(f"fused/eager > 1/{network.min_eager_over_fused:g}")
    if row.compile_fused_over_fused is not None and row.compile_fused_over_fused > 1.0:
        found.append("compile(fused) slower than fused")
    if exceeds(row.fused_max_abs, row.eager_max_abs):
        found.append("error above eager's")
    if row.grad_mode_fused_over_no_grad is not None and row.grad_mode_fused_over_no_grad > MAX_GRAD_MODE_OVER_NO_GRAD:
        found.append(f"grad mode / no_grad > {MAX_GRAD_MODE_OVER_NO_GRAD:g}")
    if row.grad_mode_fused_over_eager is not None and row.grad_mode_fused_over_eager >= 1.0:
        found.append("grad mode not faster than eager's")
    if row.eager_train_ms is not None and row.fused_train_ms is None:
        found.append("fused training step refused")
    if row.train_fused_over_eager is not None and row.train_fused_over_eager >= 1.0:
        found.append("training step not faster than eager's")
    if exceeds(row.fused_grad_max_abs, None if row.eager_grad_max_abs is None
               else MAX_GRADIENT_ERROR_OVER_EAGER * row.eager_grad_max_abs):
        found.append(f"gradient error > {MAX_GRADIENT_ERROR_OVER_EAGER:g}x eager's")
    return "; ".join(found)


def run_case(network: Network, dtype: torch.dtype, memory_format: str, device: torch.device, *, with_compile: bool,
             train: bool, rounds: int, repeats: int) -> Row:
    start = time.perf_counter()
    layout = torch.channels_last_3d if memory_format == "channels_last" else torch.contiguous_format
    built = models(network, dtype, device, layout, train=train)
    inputs = rotating_tensors(network.input_shape, dtype, device, layout)
    ms, refused = medians_over_rounds(timed_calls(built, inputs, with_compile=with_compile), rounds, repeats)
    fused = built.fused.model
    errors = max_abs_errors({"eager": built.eager, "fused": fused}, inputs[0])
    splits = {name: kernel_split_ms(model, inputs) if name in ms else dict.fromkeys(KERNEL_CLASSES)
              for name, model in (("eager", built.eager), ("fused", fused))}
    gradients = gradient_errors(built.train, inputs) if train else {}
    grad = {name: None if gradients.get(name) is None else gradients[name].max_abs for name in ("eager", "fused")}
    notes = [f"{name} refused: {why}" for name, why in refused.items()]
    notes += [f"left alone: {line}" for line in built.fused.left_alone]
    if built.fused.not_traced:
        notes.append(f"forward() not traced: {built.fused.not_traced}")
    row = Row(network.name, str(dtype).removeprefix("torch."), memory_format, len(built.fused.replaced),
              len(built.fused.left_alone), ms.get("eager"), ms.get("compile"), ms.get("fused"),
              ms.get("compile(fused)"), ratio(ms.get("fused"), ms.get("eager")),
              ratio(ms.get("fused"), ms.get("compile")), ratio(ms.get("compile(fused)"), ms.get("fused")),
              errors["eager"], errors["fused"], ms.get("eager grad mode"), ms.get("fused grad mode"),
              ratio(ms.get("fused grad mode"), ms.get("fused")),
              ratio(ms.get("fused grad mode"), ms.get("eager grad mode")),
              *splits["eager"].values(), *splits["fused"].values(),
              ms.get("eager train"), ms.get("fused train"), ratio(ms.get("fused train"), ms.get("eager train")),
              grad["eager"], grad["fused"], ratio(grad["fused"], grad["eager"]) if grad["eager"] else None,
              seconds=time.perf_counter() - start, misses="", notes="", graphed_ms=ms.get("fused+graphs"),
              compile_graphs_ms=ms.get("compile graphs"),
              graphed_over_compile=ratio(ms.get("fused+graphs"), ms.get("compile")),
              graphed_over_compile_graphs=ratio(ms.get("fused+graphs"), ms.get("compile graphs")))
    row.misses = misses(network, row)
    if "gradient error" in row.misses:
        notes.append(f"fused gradient error largest at {gradients['fused'].parameter}")
    row.notes = "; ".join(notes)
    return row


COLUMNS = [  # heading, width, the row's field, its format
    ("network", 16, "network", "s"), ("dtype", 9, "dtype", "s"), ("layout", 14, "memory_format", "s"),
    ("chains", 7, "chains_fused", "d"), ("left", 5, "chains_left_alone", "d"), ("eager", 9, "eager_ms", ".2f"),
    ("compile", 9, "compile_ms", ".2f"), ("fused", 9, "fused_ms", ".2f"), ("c(fused)", 9, "compile_fused_ms", ".2f"),
    ("f/eager", 8, "fused_over_eager", ".2f"), ("f/comp", 7, "fused_over_compile", ".2f"),
    ("c(f)/f", 7, "compile_fused_over_fused", ".2f"), ("err eager", 10, "eager_max_abs", ".1e"),
    ("err fused", 10, "fused_max_abs", ".1e"), ("eager g", 9, "eager_grad_mode_ms", ".2f"),
    ("fused g", 9, "fused_grad_mode_ms", ".2f"), ("g/ng", 6, "grad_mode_fused_over_no_grad", ".2f"),
    ("f/e g", 6, "grad_mode_fused_over_eager", ".2f"), ("graphed", 9, "graphed_ms", ".2f"),
    ("comp cg", 9, "compile_graphs_ms", ".2f"), ("fg/comp", 8, "graphed_over_compile", ".2f"),
    ("fg/ccg", 7, "graphed_over_compile_graphs", ".2f"), ("eager conv/norm/other", 23, "eager_split", ">"),
    ("fused conv/norm/other", 23, "fused_split", ">"),
]
TRAIN_COLUMNS = [("eager trn", 10, "eager_train_ms", ".2f"), ("fused trn", 10, "fused_train_ms", ".2f"),
                 ("trn f/e", 8, "train_fused_over_eager", ".2f"), ("grad eager", 11, "eager_grad_max_abs", ".1e"),
                 ("grad fused", 11, "fused_grad_max_abs", ".1e"), ("grad f/e", 9, "grad_fused_over_eager", ".2f")]
SECONDS_COLUMN = ("s", 6, "seconds", ".0f")


def run_network_bench(network_names: list[str], dtypes: list[torch.dtype], memory_formats: list[str], *,
                      with_compile: bool = True, train: bool = False, repeats: int = 10, rounds: int = 5,
                      csv_path: str | None = None, device: str = "cuda", tiny: bool = False) -> list[Row]:
    """Times the named networks (NETWORK_NAMES, or "all") in each dtype and memory
    format ("ncdhw", "channels_last"), prints the table and writes the rows to ``csv_path``."""
    unknown = set(network_names) - {"all", *NETWORK_NAMES}
    if unknown:
        raise SystemExit(f"cutlassfuse: unknown networks {', '.join(sorted(unknown))}; known: "
                         f"{', '.join(NETWORK_NAMES)}")
    where_to_run = torch.device(device)
    if where_to_run.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("cutlassfuse: no CUDA device (`--device cpu --tiny` checks the networks benchmark on the CPU)")
    monai_networks()
    networks = [network for network in NETWORKS if network.name in network_names or "all" in network_names]
    networks = [network.tiny() for network in networks] if tiny else networks
    columns = COLUMNS + (TRAIN_COLUMNS if train else []) + [SECONDS_COLUMN]
    where = torch.cuda.get_device_name() if where_to_run.type == "cuda" else "CPU"
    training = (f"; trn: forward + backward of the output's mean in train mode; grad: max abs error of all parameter "
                f"gradients against the float64 network's, target grad f/e <= {MAX_GRADIENT_ERROR_OVER_EAGER:g}, "
                "trn f/e < 1") if train else ""
    print(f"{where}, torch {torch.__version__}; median ms in eval mode under torch.no_grad(); chains fused and left "
          "alone by fuse(); targets: f/comp < 1, f/eager <= 1/3 (basicunet, segresnet), c(f)/f <= 1, err fused <= "
          f"err eager, g/ng <= {MAX_GRAD_MODE_OVER_NO_GRAD:g}, f/e g < 1 (g: in grad mode, parameters requiring grad "
          "and no backward); graphed: the fused model replaying CUDA graphs (CUDAGraphed), comp cg: "
          "torch.compile(mode='reduce-overhead'); err: max abs against the float64 network; conv/norm/other: kernel "
          "ms per call"
          f"{training}; "
          "s: the case's wall time")
    return run_table(networks, dtypes, memory_formats, columns, csv_path,
                     lambda network, dtype, memory_format: run_case(
                         network, dtype, memory_format, where_to_run, with_compile=with_compile, train=train,
                         rounds=rounds, repeats=repeats))
