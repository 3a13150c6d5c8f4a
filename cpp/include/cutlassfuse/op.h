// The torch-facing operator: argument validation, the reference (composite)
// implementation, and the CUDA implementation that picks the fused kernels when
// they apply. Schema in src/registration.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string>

#include "cutlassfuse/problem.h"

namespace cutlassfuse {

// The op's arguments as the schema passes them.
struct OpArgs {
  const at::Tensor& input;
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  const std::optional<at::Tensor>& norm_weight;
  const std::optional<at::Tensor>& norm_bias;
  int64_t num_groups;
  double eps;
  at::IntArrayRef stride;
  at::IntArrayRef padding;
  at::IntArrayRef output_padding;
  int64_t groups;
  at::IntArrayRef dilation;
  // Optional: weight already permuted to [Cin, kD, kH, kW, Cout] (a cache of the
  // module's); used by the fused path only.
  const std::optional<at::Tensor>& packed_weight;
  // Optional: the bias repeated once per output block, prod(stride) * Cout values (a
  // cache of the module's), for the pixel-shuffle GEMM of kernel == stride layers,
  // whose columns are blocks of Cout channels; ignored by every other path.
  const std::optional<at::Tensor>& packed_bias;
};

// Checks every argument (raising ValueError/TypeError naming the argument) and
// resolves the sizes. Runs before any kernel launches.
Problem validate_and_describe(const OpArgs& args);

// The memory format PyTorch's composite returns: channels-last when the input or the
// weight is channels-last (cuDNN's and the CPU kernels' rule), else contiguous.
at::MemoryFormat output_memory_format(const at::Tensor& input, const at::Tensor& weight);

// GroupNorm(ReLU(ConvTranspose3d(...))) through ATen's own kernels on any device.
at::Tensor reference_forward(const OpArgs& args);

#if CUTLASSFUSE_WITH_CUDA
// Empty when the fused sm90 path takes the call, else why not.
std::string fused_path_unsupported_reason(const OpArgs& args, const Problem& problem);
// Process-wide switch of the fused path (on by default), for benchmarking the fallback.
void set_fused_path_enabled(bool enabled);
// How many streams the fused path spreads sub-pixel phases over (1, the default, to 8).
void set_phase_streams(int64_t lanes);
// The fused sm90 path's result, or nothing when it does not take the call
// (fused_path_unsupported_reason says why); the call's launches are planned once.
std::optional<at::Tensor> fused_forward_cuda(const OpArgs& args, const Problem& problem);
// What the fused path runs for `problem` (kernel configuration included).
std::string fused_path_description(const OpArgs& args, const Problem& problem);
// Empty when the CUDA fallback takes the call (cuDNN's convolution, then this
// project's ReLU + GroupNorm kernels), else why not.
std::string fallback_unsupported_reason(const OpArgs& args, const Problem& problem);
at::Tensor fallback_forward_cuda(const OpArgs& args, const Problem& problem);
// What the fallback runs for a call of this dtype.
std::string fallback_description(const OpArgs& args);
// ConvTranspose3d alone through the stock CUTLASS sm90 dgrad (plain store, NDHWC
// output): the baseline of the fused epilogue, for benchmarks.
at::Tensor cutlass_dgrad_plain(const OpArgs& args, const Problem& problem);
#endif

}  // namespace cutlassfuse
