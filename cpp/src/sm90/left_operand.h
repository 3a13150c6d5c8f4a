// The sm90 GEMMs' operands as the kernels read them, from the op's tensors.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "cutlassfuse/common/tf32_scaling.h"
#include "cutlassfuse/plan/math_mode.h"
#include "dispatch/call_workspace.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse::sm90 {

// The deconvolution's left operand: the input itself when the kernel reads its layout
// (channels-last, or NCDHW for the pixel-major GEMM); else NDHWC from one pass of this
// project's transpose kernel (ATen's permuted copy is slower on this pattern); float32
// as bfloat16 pieces side by side (float32_split.h), or scaled to float16 at TF32's
// precision (tf32_scaling.h), by one kernel.
class LeftOperand {
 public:
  LeftOperand(const at::Tensor& input, MathMode math, const Problem& p, bool pixel_major, CallWorkspace& workspace);

  // The input, dense in its memory format (NCDHW or channels-last).
  const at::Tensor& source() const { return source_; }

  // The operand's data, converted on `stream` if needed; after workspace.allocate().
  // `scales`: the call's, measured, where the math mode scales its operands.
  const void* prepare(const CallWorkspace& workspace, const Tf32OperandScales* scales, cudaStream_t stream) const;

 private:
  at::Tensor source_;
  MathMode math_;
  const Problem& problem_;
  bool channels_last_;
  std::optional<CallWorkspace::Region> converted_;
};

// The filter packed [Cin, T, R, S, Cout] (PyTorch's (Cin, Cout, T, R, S) permuted): the
// caller's pre-packed copy when given (the module caches one per weight version), else
// permuted here.
at::Tensor packed_filter(const OpArgs& args);

// The packed filter as the GEMMs' right operand: as it is in 16 bits; for bf16x3, block
// b along Cin holds piece filter_piece(b) (split_float32_filter, one launch: a small
// layer's call is bound by the host's time to issue it); for TF32, scaled to float16 on
// `stream` (scale_filter_tf32, which also writes scales->descale).
at::Tensor right_operand(const at::Tensor& packed, MathMode math, Tf32OperandScales* scales, cudaStream_t stream);

}  // namespace cutlassfuse::sm90
