"""Backward of torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm, registered with
torch.library.register_autograd.

What is saved: the op's inputs only. Backward recomputes the pre-norm activation
y = ReLU(ConvTranspose3d(x)) with one deconvolution instead of keeping it alive from
forward to backward (for KernelBench level2/61 in fp16 that tensor is 161 MB per
call, as large as the output). The trade-off is measured in docs/performance.md.
Everything is ATen ops, written out rather than taken from torch.autograd.grad, so
AOT autograd traces it for torch.compile and torch.export.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_OP = "cutlassfuse::conv_transpose3d_relu_group_norm"


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _setup_context(ctx, inputs, output) -> None:
    input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding, groups, dilation, _ = inputs
    ctx.save_for_backward(input, weight, bias, norm_weight, norm_bias)
    ctx.conv = dict(stride=stride, padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
    ctx.num_groups = num_groups
    ctx.eps = eps


def _group_norm_backward(y, grad_out, num_groups, eps, gamma):
    """Gradients of GroupNorm(y) with respect to y, gamma and beta (biased variance,
    eps inside the square root), in y's dtype."""
    n, c = y.shape[:2]
    yg = y.reshape(n, num_groups, c // num_groups, -1)
    dz = grad_out.reshape(yg.shape)
    var, mean = torch.var_mean(yg, dim=(2, 3), correction=0, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    xhat = (yg - mean) * rstd
    dxhat = dz if gamma is None else dz * gamma.reshape(1, num_groups, -1, 1)
    dy = rstd * (dxhat - dxhat.mean(dim=(2, 3), keepdim=True) - xhat * (dxhat * xhat).mean(dim=(2, 3), keepdim=True))
    return dy, (dz * xhat).sum(dim=(0, 3)).reshape(c), dz.sum(dim=(0, 3)).reshape(c)


def _backward(ctx, grad_out):
    input, weight, bias, norm_weight, norm_bias = ctx.saved_tensors
    need = ctx.needs_input_grad
    acc = _accumulation_dtype(input.dtype)
    y = F.relu(F.conv_transpose3d(input, weight, bias, **ctx.conv))
    gamma = None if norm_weight is None else norm_weight.to(acc)
    dy, dgamma, dbeta = _group_norm_backward(y.to(acc), grad_out.to(acc), ctx.num_groups, ctx.eps, gamma)
    # ReLU passes gradient where its output is positive (as torch's threshold_backward).
    da = (dy.reshape(y.shape) * (y > 0)).to(input.dtype)
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        da, input, weight, None if bias is None else [bias.shape[0]], ctx.conv["stride"], ctx.conv["padding"],
        ctx.conv["dilation"], True, ctx.conv["output_padding"], ctx.conv["groups"],
        [need[0], need[1], bias is not None and need[2]])
    return (
        grad_input if need[0] else None,
        grad_weight if need[1] else None,
        grad_bias if bias is not None and need[2] else None,
        dgamma.to(norm_weight.dtype) if norm_weight is not None and need[3] else None,
        dbeta.to(norm_bias.dtype) if norm_bias is not None and need[4] else None,
        None, None, None, None, None, None, None, None,
    )


torch.library.register_autograd(_OP, _backward, setup_context=_setup_context)
