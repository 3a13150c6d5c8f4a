"""A forward in grad mode (tensors that require grad, no backward yet) on every CUDA
path: it runs this project's kernels, not ATen's composite (explain() says what it keeps
and no path named "reference"), its output equals the same call's under no_grad bit for
bit, and what it keeps for the backward, written into poisoned memory, equals ReLU(conv)
(where the fused path takes no call, as in float32 mode "pytorch" or with it turned
off: the convolution's output without bias, in the output's layout; where it runs the
pixel-shuffle GEMM: ReLU(conv) in that GEMM's space-to-depth order) and GroupNorm's
statistics computed in float64 within the dtype's rounding."""

import pytest
import torch
import torch.nn.functional as F

import cutlassfuse
from cutlassfuse import backends
from cutlassfuse.testing import fused_path_expected, make_inputs, op_arguments, poison_cuda_allocator

pytestmark = pytest.mark.gpu

# (name, layer): sub-pixel phases, kernel == stride (the pixel-shuffle GEMM), unit
# stride with bias-free conv, channel counts the fused path does not take.
LAYERS = {
    "unit_stride": dict(batch=2, in_channels=16, out_channels=32, size=(5, 6, 7), kernel=3, num_groups=4, bias=False),
    "phases": dict(batch=2, in_channels=16, out_channels=64, size=(4, 5, 6), kernel=3, stride=2, padding=1,
                   output_padding=1, num_groups=8),
    "pixel_shuffle_gemm": dict(batch=2, in_channels=32, out_channels=16, size=(4, 4, 6), kernel=2, stride=2,
                               num_groups=4),
    "odd_channels": dict(batch=3, in_channels=5, out_channels=12, size=(3, 4, 5), kernel=3, stride=2, num_groups=3),
}
# (dtype, float32 mode, fused path on)
MODES = [(torch.float16, "pytorch", True), (torch.bfloat16, "pytorch", True), (torch.float32, "tf32", True),
         (torch.float32, "bf16x3", True), (torch.float32, "pytorch", True), (torch.float16, "pytorch", False),
         (torch.float32, "pytorch", False)]
# Max abs error of the kept activation and statistics against float64, relative to the
# activation's largest value: the dtype's rounding of the convolution's sums.
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 4e-3}


def expected_path(layer: str, dtype: torch.dtype, mode: str, fused: bool) -> str:
    tensor_cores = dtype != torch.float32 or mode != "pytorch"
    takes_fused = fused and tensor_cores and fused_path_expected() and layer != "odd_channels"
    return "fused_sm90" if takes_fused else "fallback"


def float64_conv_output(a: dict, with_bias: bool) -> torch.Tensor:
    bias = None if a["bias"] is None or not with_bias else a["bias"].double()
    return F.conv_transpose3d(a["input"].double(), a["weight"].double(), bias, a["stride"], a["padding"],
                              a["output_padding"], a["groups"], a["dilation"])


def float64_activation_and_statistics(a: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y = F.relu(float64_conv_output(a, with_bias=True))
    grouped = y.reshape(y.shape[0], a["num_groups"], -1)
    mean = grouped.mean(-1)
    rstd = (grouped.var(-1, unbiased=False) + a["eps"]).rsqrt()
    return y, mean, rstd


MODE_IDS = [f"{str(d).removeprefix('torch.')}-{m}-{'fused' if f else 'fallback'}" for d, m, f in MODES]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("dtype, mode, fused", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("layer", LAYERS)
def test_grad_mode_forward_runs_the_kernels_and_keeps_the_backward_tensors(layer: str, dtype: torch.dtype, mode: str,
                                                                           fused: bool, channels_last: bool):
    a = make_inputs(**LAYERS[layer], dtype=dtype, device="cuda", channels_last=channels_last, seed=7)
    with backends.flags(fused_path=fused), cutlassfuse.float32_mode(mode), \
            torch.backends.cudnn.flags(enabled=True, deterministic=True, allow_tf32=False):
        with torch.no_grad():
            untracked = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
        a["weight"].requires_grad_()
        path = cutlassfuse.explain(**a)
        assert path.startswith(expected_path(layer, dtype, mode, fused)), path
        assert "keeping for the backward" in path, path
        # Calls the fused path takes for no sizes keep the convolution's output.
        keep_conv_output = (dtype == torch.float32 and mode == "pytorch") or not fused or not fused_path_expected()
        assert ("the convolution's output without bias" in path) == keep_conv_output, path
        # Calls the fused path runs as its pixel-shuffle GEMM keep the order it writes.
        keep_space_to_depth = not keep_conv_output and layer == "pixel_shuffle_gemm"
        assert ("space-to-depth order" in path) == keep_space_to_depth, path
        poison_cuda_allocator(4 * untracked.numel() * untracked.element_size())
        out, kept, mean, rstd = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm_for_backward(
            *op_arguments(a), keep_conv_output, keep_space_to_depth)
        tracked = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
    assert tracked.requires_grad
    assert torch.equal(out, untracked) and torch.equal(tracked.detach(), untracked)
    layout = torch.channels_last_3d if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=layout)
    exact, exact_mean, exact_rstd = float64_activation_and_statistics(a)
    scale = exact.abs().max().item()
    if keep_conv_output:
        assert kept.is_contiguous(memory_format=layout)
        assert (kept.double() - float64_conv_output(a, with_bias=False)).abs().max().item() <= TOLERANCE[dtype] * scale
    elif keep_space_to_depth:
        n, c, d, h, w = exact.shape
        blocked = exact.permute(0, 2, 3, 4, 1).reshape(n, d // 2, 2, h // 2, 2, w // 2, 2, c)
        expected = blocked.permute(0, 1, 3, 5, 2, 4, 6, 7)
        assert kept.is_contiguous() and kept.shape == expected.shape
        assert (kept.double() - expected).abs().max().item() <= TOLERANCE[dtype] * scale
    else:
        assert kept.is_contiguous(memory_format=torch.channels_last_3d)
        assert (kept.double() - exact).abs().max().item() <= TOLERANCE[dtype] * scale
    assert (mean.double() - exact_mean).abs().max().item() <= TOLERANCE[dtype] * scale
    assert ((rstd.double() - exact_rstd) / exact_rstd).abs().max().item() <= TOLERANCE[dtype]


@pytest.mark.parametrize("channels_last", [False, True], ids=["ncdhw", "channels_last"])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "fallback"])
@pytest.mark.parametrize("layer", ["phases", "pixel_shuffle_gemm"])
def test_grad_mode_forward_is_bitwise_repeatable_and_trains(layer: str, fused: bool, channels_last: bool):
    """Two tracked forwards give the same bits, and their backward the same gradients."""
    a = make_inputs(**LAYERS[layer], dtype=torch.float16, device="cuda", channels_last=channels_last, seed=3,
                    requires_grad=True)
    grad = torch.randn(cutlassfuse.conv_transpose3d_relu_group_norm(**a).shape, device="cuda", dtype=torch.float16)
    results = []
    with backends.flags(fused_path=fused):
        for _ in range(2):
            for t in a.values():
                if isinstance(t, torch.Tensor):
                    t.grad = None
            out = cutlassfuse.conv_transpose3d_relu_group_norm(**a)
            out.backward(grad)
            results.append([out.detach()] + [a[k].grad for k in ("input", "weight", "bias", "norm_weight",
                                                                 "norm_bias")])
    for first, second in zip(*results, strict=True):
        assert torch.equal(first, second)
