// The sm90 GEMMs' operands as the kernels read them, from the op's tensors.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "cutlassfuse/plan/math_mode.h"
#include "dispatch/call_workspace.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse::sm90 {

// The deconvolution's left operand: the input itself when the kernel reads its layout
// (channels-last, or NCDHW for the pixel-major GEMM); else NDHWC from one pass of this
// project's transpose kernel (ATen's permuted copy is slower on this pattern); float32
// as bfloat16 pieces side by side (float32_split.h), split by one kernel.
class LeftOperand {
 public:
  LeftOperand(const at::Tensor& input, MathMode math, const Problem& p, bool pixel_major, CallWorkspace& workspace);

  // The operand's data, converted on `stream` if needed; after workspace.allocate().
  const void* prepare(const CallWorkspace& workspace, cudaStream_t stream) const;

 private:
  const at::Tensor& input_;
  MathMode math_;
  const Problem& problem_;
  bool channels_last_;
  std::optional<CallWorkspace::Region> converted_;
};

// The filter as the right operand of the GEMMs of `conv` (the problem the kernels run:
// the call's, or its pixel-shuffle GEMM's): [Cin, T, R, S, Cout], the caller's
// pre-packed copy when given (the module caches one per weight version), else permuted
// here; for bf16x3, block b along Cin holds piece filter_piece(b) (split through ATen:
// the filter is small next to the input). For TF32, the forward convolutions' filter:
// taps reversed, packed K-major [Cout, T, R, S, Cin], rounded to nearest TF32 on
// `stream`.
at::Tensor right_operand(const OpArgs& args, MathMode math, const Problem& conv, cudaStream_t stream);

}  // namespace cutlassfuse::sm90
