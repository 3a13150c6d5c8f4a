"""nn.Module front end: a drop-in for ConvTranspose3d -> ReLU -> GroupNorm."""

from __future__ import annotations

import functools

import torch
import torch.utils.checkpoint
from torch import Tensor, nn
from torch.nn.common_types import _size_3_t

from . import direct_calls
from .blocks import module_tensor
from .ops import _pack_bias, _pack_weight
from .packed_copy import PackedParameters

class ConvTranspose3dReLUGroupNorm(PackedParameters):
    """``GroupNorm(ReLU(ConvTranspose3d(x)))`` computed by one fused op.

    The constructor takes KernelBench's ``Model(in_channels, out_channels, kernel_size,
    groups, bias=False)`` arguments (``groups`` is GroupNorm's group count) plus every
    other ConvTranspose3d / GroupNorm option. The parameters live in
    ``conv_transpose`` (an ``nn.ConvTranspose3d``) and ``group_norm`` (an
    ``nn.GroupNorm``), created in that order, so state_dict keys and same-seed
    initialisation are exactly those of the original model.

    ``recompute=True`` trades time for memory in training: the forward keeps only its
    input for the backward (not the activation and the GroupNorm statistics, the
    output's size), and the backward runs the fused forward again to get them back
    (``torch.utils.checkpoint``, non-reentrant). Inference is unaffected.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: _size_3_t,
        groups: int,
        bias: bool = False,
        *,
        stride: _size_3_t = 1,
        padding: _size_3_t = 0,
        output_padding: _size_3_t = 0,
        dilation: _size_3_t = 1,
        conv_groups: int = 1,
        eps: float = 1e-5,
        affine: bool = True,
        recompute: bool = False,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.recompute = recompute
        factory = {"device": device, "dtype": dtype}
        self.conv_transpose = nn.ConvTranspose3d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding,
            output_padding=output_padding, groups=conv_groups, bias=bias, dilation=dilation, **factory)
        self.group_norm = nn.GroupNorm(groups, out_channels, eps=eps, affine=affine, **factory)

    @classmethod
    def from_modules(cls, conv: nn.ConvTranspose3d, norm: nn.GroupNorm, *,
                     recompute: bool = False) -> ConvTranspose3dReLUGroupNorm:
        """The fused block around existing modules: their very parameters (and hooks,
        and optimizer state keyed on them) are kept, not copied."""
        if conv.padding_mode != "zeros":
            raise ValueError(f"cutlassfuse: ConvTranspose3d padding_mode must be 'zeros', got {conv.padding_mode!r}")
        if norm.num_channels != conv.out_channels:
            raise ValueError(f"cutlassfuse: GroupNorm has {norm.num_channels} channels, the conv gives "
                             f"{conv.out_channels}")
        block = cls.__new__(cls)
        nn.Module.__init__(block)
        block.training = conv.training  # the mode of the layers it stands in for
        block.conv_transpose = conv
        block.group_norm = norm
        block.recompute = recompute
        return block

    def _conv_operands(self) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None]:
        """The convolution's weight and bias, then the weight in the tensor-core kernel's
        layout and the bias repeated per block of stride_d * stride_h * stride_w output
        pixels (``_pack_bias``: the epilogue of a kernel == stride layer's GEMM reads it,
        the op decides which layers those are and ignores it for the others), each
        re-packed only when it changed (in place, replaced, moved or cast) since the last
        call. The packed copies are None on the CPU and while compiling (there the
        permutation is part of the traced graph), and for an absent bias. One check of the
        call's context serves both: small calls are bound by the host."""
        conv = self._modules["conv_transpose"]
        weight, bias = module_tensor(conv, "weight"), module_tensor(conv, "bias")
        if not self._may_keep_copies(weight):
            return weight, bias, None, None
        packed_weight = self._kept_copy("weight", weight, _pack_weight)
        if bias is None:
            return weight, bias, packed_weight, None
        pack_bias = functools.partial(_pack_bias, stride=conv.stride)
        if bias.dtype != weight.dtype:  # autocast may allow the one and not the other
            return weight, bias, packed_weight, self._packed_copy("bias", bias, pack_bias)
        return weight, bias, packed_weight, self._kept_copy("bias", bias, pack_bias)

    def extra_repr(self) -> str:
        """The options as nn.ConvTranspose3d and nn.GroupNorm print theirs, defaults left
        out. The convolution's groups print as ``conv_groups``, the constructor's keyword
        (its ``groups`` is GroupNorm's group count, printed as ``num_groups``)."""
        conv, norm = self.conv_transpose, self.group_norm
        options = [f"{conv.in_channels}, {conv.out_channels}", f"kernel_size={conv.kernel_size}",
                   f"stride={conv.stride}"]
        defaults = {"padding": (0, 0, 0), "output_padding": (0, 0, 0), "dilation": (1, 1, 1)}
        options += [f"{name}={getattr(conv, name)}" for name, default in defaults.items()
                    if getattr(conv, name) != default]
        if conv.groups != 1:
            options.append(f"conv_groups={conv.groups}")
        if conv.bias is None:
            options.append("bias=False")
        options += [f"num_groups={norm.num_groups}", f"eps={norm.eps}", f"affine={norm.affine}"]
        if self.recompute:
            options.append("recompute=True")
        return ", ".join(options)

    def forward(self, x: Tensor, output_size: list[int] | None = None) -> Tensor:
        """``output_size`` as in ``nn.ConvTranspose3d.forward``: picks the output padding
        that gives this (D, H, W) (U-Net decoders pass the skip connection's size)."""
        conv = self._modules["conv_transpose"]
        output_padding = conv.output_padding
        if output_size is not None:
            output_padding = tuple(conv._output_padding(x, output_size, conv.stride, conv.padding, conv.kernel_size, 3,
                                                        conv.dilation))
        if self.recompute and torch.is_grad_enabled():
            # Keeps nothing but the input for the backward, which runs the fused forward
            # again to get the activation and the statistics back.
            return torch.utils.checkpoint.checkpoint(self._call, x, output_padding, use_reentrant=False)
        return self._call(x, output_padding)

    def _call(self, x: Tensor, output_padding: tuple[int, ...]) -> Tensor:
        # The op's kernels without the functional wrapper, and without the dispatcher where it
        # would add nothing (direct_calls): nn.ConvTranspose3d already holds its options as
        # 3-tuples, and small calls are bound by the host's time per call (so the children
        # and their parameters are read from the module dicts, not through
        # nn.Module.__getattr__).
        children = self._modules
        conv, norm = children["conv_transpose"], children["group_norm"]
        weight, bias, packed_weight, packed_bias = self._conv_operands()
        return direct_calls.conv_transpose3d_relu_group_norm((
            x, weight, bias, module_tensor(norm, "weight"), module_tensor(norm, "bias"), norm.num_groups, norm.eps,
            conv.stride, conv.padding, output_padding, conv.groups, conv.dilation, packed_weight, packed_bias))
