"""The resident norm kernel (one cooperative launch holding the tensor on chip: in shared
memory, and where larger, the rest in L2), for the standalone norm and the fallback
blocks' norm: which calls it takes,
that it ran (the profiler sees it and not the separate statistics kernel), outputs
against float64 no further from it than eager in the same dtype, bitwise repeatable,
every output element written, and the mean and rstd the backward reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import errors, poison_cuda_allocator
from test_blocks_cuda import assert_block_no_further_from_float64_than_eager, build, cast  # tests/gpu
from test_norm_statistics import FLOOR, affine, kernel_grids, make_input, seed_of  # tests/gpu

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("strict_float32")]

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
RESIDENT = "norm: one cutlassfuse activation/GroupNorm kernel"
SEPARATE = "norm: cutlassfuse activation/GroupNorm statistics, finalize and normalize kernels"

# (shape, num_groups): calls the resident kernel takes in both layouts
TAKEN = {
    # SegResNet's second level at 64^3: 17 MB of 16-bit data over every block of the GPU
    "segres_64": ((1, 32, 64, 64, 64), 8),
    # InstanceNorm over 32 channels of two samples: 64 units of a few blocks each
    "instance_two_samples": ((2, 32, 16, 20, 24), 32),
    # groups of 32 channels, rows of 16 vectors of 16-bit data
    "wide_groups": ((2, 128, 6, 8, 10), 4),
    # a unit smaller than one vector per thread of a block
    "tiny": ((3, 8, 2, 2, 2), 2),
    # 45 MB of 16-bit data: a third of each block's part streams through L2
    "streams": ((1, 16, 112, 112, 112), 8),
}

# (shape, num_groups, channels_last, dtype): calls it leaves to the separate launches
LEFT = {
    # 262 MB of 16-bit data, more than shared memory and L2 hold
    "beyond_l2": ((1, 32, 160, 160, 160), 8, True, torch.float16),
    # 34 MB of float32 data: larger than shared memory, and float32 does not stream
    "float32_beyond_shared": ((1, 32, 64, 64, 64), 8, False, torch.float32),
    "odd_pixels_ncdhw": ((2, 16, 9, 9, 9), 4, False, torch.float16),
    "twelve_channels_channels_last": ((2, 12, 8, 8, 8), 3, True, torch.float16),
    "many_units": ((512, 16, 2, 2, 2), 16, False, torch.float16),
}

ACTIVATIONS = {"identity": None, "relu": None, "silu": None, "leaky_relu": 0.1, "prelu": "slopes"}


def explain(x: torch.Tensor, num_groups: int) -> str:
    return cutlassfuse.explain_block(cutlassfuse.group_norm_activation, x, num_groups, activation="relu")


def activation_arguments(name: str, channels: int, dtype, seed: int) -> dict:
    if name == "prelu":
        generator = torch.Generator("cuda").manual_seed(seed)
        slopes = torch.rand(channels, device="cuda", generator=generator) * 0.4 + 0.05
        return dict(activation="prelu", activation_weight=slopes.to(dtype))
    parameter = ACTIVATIONS[name]
    return dict(activation=name) if parameter is None else dict(activation=name, activation_parameter=parameter)


def reference(x: torch.Tensor, num_groups: int, weight, bias, name: str, arguments: dict) -> torch.Tensor:
    y = F.group_norm(x, num_groups, weight, bias)
    if name == "identity":
        return y
    if name == "relu":
        return F.relu(y)
    if name == "silu":
        return F.silu(y)
    if name == "leaky_relu":
        return F.leaky_relu(y, arguments["activation_parameter"])
    return F.prelu(y, arguments["activation_weight"].to(y.dtype))


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("case", TAKEN)
def test_takes_and_runs_one_kernel(case, channels_last):
    shape, num_groups = TAKEN[case]
    x = make_input(shape, torch.float16, channels_last, seed_of("runs", case, channels_last))
    assert explain(x, num_groups).startswith(RESIDENT)
    with torch.no_grad():
        resident = kernel_grids(lambda: cutlassfuse.group_norm_activation(x, num_groups, activation="relu"),
                                "norm_activation_resident_kernel")
        separate = kernel_grids(lambda: cutlassfuse.group_norm_activation(x, num_groups, activation="relu"),
                                "norm_activation_stats_kernel")
    assert len(resident) == 1 and not separate, (resident, separate)
    with backends.flags(resident_norm=False):
        assert explain(x, num_groups) == SEPARATE


@pytest.mark.parametrize("case", LEFT)
def test_leaves_other_calls_to_the_separate_kernels(case):
    shape, num_groups, channels_last, dtype = LEFT[case]
    x = make_input(shape, dtype, channels_last, seed_of("left", case))
    assert explain(x, num_groups) == SEPARATE
    with torch.no_grad():
        assert not kernel_grids(lambda: cutlassfuse.group_norm_activation(x, num_groups, activation="relu"),
                                "norm_activation_resident_kernel")


def test_streams_what_shared_memory_does_not_hold():
    """The "streams" call is larger than the shared memory of every SM together: it is
    taken because the rest of each block's part streams through L2."""
    shape, num_groups = TAKEN["streams"]
    x = make_input(shape, torch.float16, True, seed_of("streams"))
    properties = torch.cuda.get_device_properties(x.device)
    shared = properties.multi_processor_count * properties.shared_memory_per_multiprocessor
    assert x.numel() * x.element_size() > shared, (x.numel(), shared)
    assert explain(x, num_groups).startswith(RESIDENT)


# float32 tensors larger than shared memory (segres_64's 34 MB, "streams"' 90 MB) do not stream
CASE_DTYPES = [(case, dtype) for case in TAKEN for dtype in DTYPES
               if not (case in ("segres_64", "streams") and dtype == torch.float32)]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize(("case", "dtype"), CASE_DTYPES, ids=[f"{c}-{str(d)[6:]}" for c, d in CASE_DTYPES])
def test_against_float64(case, dtype, activation, channels_last):
    shape, num_groups = TAKEN[case]
    seed = seed_of("float64", case, activation, channels_last, dtype)
    x = make_input(shape, dtype, channels_last, seed)
    weight, bias = affine(shape[1], dtype, seed) if activation != "identity" else (None, None)
    arguments = activation_arguments(activation, shape[1], dtype, seed)
    assert explain(x, num_groups).startswith(RESIDENT)
    expected = reference(x.double(), num_groups, None if weight is None else weight.double(),
                         None if bias is None else bias.double(), activation,
                         {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in arguments.items()})
    with torch.no_grad():
        poison_cuda_allocator(4 * x.numel() * x.element_size())
        out = cutlassfuse.group_norm_activation(x, num_groups, weight, bias, **arguments)
        again = cutlassfuse.group_norm_activation(x, num_groups, weight, bias, **arguments)
        eager = reference(x, num_groups, weight, bias, activation, arguments)
    assert out.is_contiguous(memory_format=torch.channels_last_3d if channels_last else torch.contiguous_format)
    assert not out.isnan().any(), "an output element was not written"
    ours, theirs = errors(out, expected), errors(eager, expected)
    assert ours.max_abs <= max(1.5 * theirs.max_abs, FLOOR[dtype]), f"cutlassfuse {ours}, eager {theirs}"
    assert torch.equal(out, again), "two runs differ"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
def test_gradients_from_the_resident_forward(channels_last, dtype):
    """Grad mode keeps mean and rstd from the resident launch; the backward reads them."""
    shape, num_groups = (2, 32, 12, 12, 16), 8
    seed = seed_of("gradients", channels_last, dtype)
    x = make_input(shape, dtype, channels_last, seed)
    weight, bias = affine(shape[1], dtype, seed)
    assert explain(x, num_groups).startswith(RESIDENT)
    grad = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dtype)

    def gradients(x, weight, bias, fn):
        leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
        fn(*leaves).backward(grad.to(leaves[0].dtype))
        return [t.grad for t in leaves]

    expected = gradients(x.double(), weight.double(), bias.double(),
                         lambda x, w, b: F.silu(F.group_norm(x, num_groups, w, b)))
    ours = gradients(x, weight, bias,
                     lambda x, w, b: cutlassfuse.group_norm_activation(x, num_groups, w, b, activation="silu"))
    eager = gradients(x, weight, bias, lambda x, w, b: F.silu(F.group_norm(x, num_groups, w, b)))
    for name, o, e, r in zip(("input", "weight", "bias"), ours, eager, expected, strict=True):
        mine, theirs = errors(o, r), errors(e, r)
        assert mine.relative <= max(1.25 * theirs.relative, 1e-6), f"{name}: cutlassfuse {mine}, eager {theirs}"



def test_cuda_graph_replays_the_resident_launch():
    """A captured call replays the cooperative launch on new input, bitwise equal to an
    eager call on that input."""
    shape, num_groups = (2, 32, 16, 20, 24), 8
    static = make_input(shape, torch.float16, True, seed_of("graph", 0))
    assert explain(static, num_groups).startswith(RESIDENT)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture, as torch.cuda.graphs asks
            cutlassfuse.group_norm_activation(static, num_groups, activation="silu")
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            out = cutlassfuse.group_norm_activation(static, num_groups, activation="silu")
        static.copy_(make_input(shape, torch.float16, True, seed_of("graph", 1)))
        graph.replay()
        expected = cutlassfuse.group_norm_activation(static, num_groups, activation="silu")
    torch.cuda.synchronize()
    assert torch.equal(out, expected)


# (dtype, channels_last, pixels): fallback blocks whose output the resident kernel takes in
# place: channels-last 16-bit, and NCDHW float32 with pixels a multiple of 8; the last
# one's output (57 MB) streams in part through L2
FALLBACK_BLOCKS = [(torch.float16, True, (6, 5, 7)), (torch.bfloat16, True, (6, 5, 7)),
                   (torch.float32, False, (8, 6, 4)), (torch.float32, True, (6, 5, 7)),
                   (torch.float16, True, (96, 96, 96))]


@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "grad_mode"])
@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
@pytest.mark.parametrize(("dtype", "channels_last", "pixels"), FALLBACK_BLOCKS,
                         ids=[f"{str(d)[6:]}-{'cl' if c else 'ncdhw'}" for d, c, _ in FALLBACK_BLOCKS])
def test_fallback_block_norm_in_one_launch(dtype, channels_last, pixels, before, grad_mode):
    """A block on the fallback (cuDNN's convolution) normalizes its output in the resident
    launch, the bias and an activation before or after the norm applied there; in grad mode
    it keeps the convolution's output and writes the output beside it."""
    seed = seed_of("fallback", dtype, channels_last, before, grad_mode)
    modules64 = cast(build(False, "prelu", ("group", 4, True, True, 1), seed), torch.float64)
    modules = cast(modules64, dtype)
    conv, norm, act = modules
    memory_format = torch.channels_last_3d if channels_last else torch.contiguous_format
    x = make_input((2, 8, *pixels), dtype, channels_last, seed)

    def call():
        return cutlassfuse.conv3d_norm_activation(x, conv.weight, conv.bias, padding=1, num_groups=4,
                                                  norm_weight=norm.weight, norm_bias=norm.bias, activation="prelu",
                                                  activation_weight=act.weight, activation_before_norm=before)

    with backends.flags(fused_path=False):
        path = cutlassfuse.explain_block(cutlassfuse.conv3d_norm_activation, x, conv.weight, conv.bias, padding=1,
                                         num_groups=4, activation="prelu", activation_weight=act.weight)
        assert path.startswith("fallback:") and RESIDENT[len("norm: "):] in path, path
        with torch.set_grad_enabled(grad_mode):
            resident = kernel_grids(call, "norm_activation_resident_kernel")
            separate = kernel_grids(call, "norm_activation_stats_kernel")
        assert len(resident) == 1 and not separate, (resident, separate)
        if not grad_mode:
            assert_block_no_further_from_float64_than_eager(x, modules, modules64, before, memory_format)
        with backends.flags(resident_norm=False):
            assert RESIDENT[len("norm: "):] not in cutlassfuse.explain_block(
                cutlassfuse.conv3d_norm_activation, x, conv.weight, conv.bias, padding=1, num_groups=4,
                activation="prelu", activation_weight=act.weight)
