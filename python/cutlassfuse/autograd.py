"""Backward of torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm, registered with
torch.library.register_autograd.

What is saved: the op's inputs only. Backward recomputes the pre-norm activation
y = ReLU(ConvTranspose3d(x)) with one deconvolution instead of keeping it alive from
forward to backward (for KernelBench level2/61 in fp16 that tensor is 161 MB per call,
as large as the output). The trade-off is measured in docs/performance.md. Everything
is ATen ops, so AOT autograd traces it for torch.compile and torch.export.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._prims_common import suggest_memory_format

_OP = "cutlassfuse::conv_transpose3d_relu_group_norm"


def _setup_context(ctx, inputs, output) -> None:
    input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding, groups, dilation, _ = inputs
    ctx.save_for_backward(input, weight, bias, norm_weight, norm_bias)
    ctx.conv = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    ctx.num_groups = num_groups
    ctx.eps = eps


def _backward(ctx, grad_out):
    input, weight, bias, norm_weight, norm_bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    aten = torch.ops.aten
    y = F.relu(F.conv_transpose3d(input, weight, bias, **ctx.conv))
    n, c, spatial = y.shape[0], y.shape[1], y[0, 0].numel()
    gamma = None if norm_weight is None else norm_weight.to(y.dtype)
    # ATen's GroupNorm kernels accumulate statistics and gradients in fp32 inside the
    # kernels, with no full-size fp32 temporaries (a version written out in elementwise
    # ops peaked at 4x eager's memory on the GPU).
    _, mean, rstd = aten.native_group_norm(y, gamma, None, n, c, spatial, ctx.num_groups, ctx.eps)
    dy, dgamma, dbeta = aten.native_group_norm_backward(
        grad_out.contiguous(memory_format=suggest_memory_format(y)), y, mean, rstd, gamma, n, c, spatial,
        ctx.num_groups, [True, norm_weight is not None and need[3], norm_bias is not None and need[4]])
    da = aten.threshold_backward(dy, y, 0)  # ReLU passes gradient where its output is positive
    grad_input, grad_weight, grad_bias = aten.convolution_backward(
        da, input, weight, None if bias is None else [bias.shape[0]], ctx.conv["stride"], ctx.conv["padding"],
        ctx.conv["dilation"], True, ctx.conv["output_padding"], ctx.conv["groups"],
        [need[0], need[1], bias is not None and need[2]])
    return (
        grad_input if need[0] else None,
        grad_weight if need[1] else None,
        grad_bias if bias is not None and need[2] else None,
        dgamma.to(norm_weight.dtype) if dgamma is not None else None,
        dbeta.to(norm_bias.dtype) if dbeta is not None else None,
        None, None, None, None, None, None, None, None,
    )


torch.library.register_autograd(_OP, _backward, setup_context=_setup_context)
