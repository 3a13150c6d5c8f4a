// The torch-facing operator: argument validation, the reference (composite)
// implementation, and the CUDA implementation that routes a call to a kernel path.
// Schemas in src/torch/registration.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string>
#include <tuple>

#include "cutlassfuse/plan/problem.h"

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

// What a call keeping for its backward keeps beside GroupNorm's mean and rstd.
enum class KeptTensor {
  // The activation ReLU(ConvTranspose3d(...) + bias), channels_last_3d in the op's dtype.
  kActivation,
  // The convolution's output without its bias, in the output's memory format (the
  // backward recomputes the activation from it and the bias).
  kConvOutput,
  // The activation in the pixel-shuffle GEMM's space-to-depth order (plan/subpixel.h,
  // is_pixel_shuffle_gemm): [batch, D, H, W, stride_d, stride_h, stride_w, channels]
  // contiguous over the input's extent D, H, W, as that GEMM's epilogue stores it.
  kActivationSpaceToDepth,
};
// The keeping op's two flags as one KeptTensor; raises when both are set.
KeptTensor kept_tensor(bool keep_conv_output, bool keep_space_to_depth);
// Raises ValueError when `problem` cannot keep `kept` (space-to-depth order is the
// pixel-shuffle GEMM's layers' only).
void validate_kept(KeptTensor kept, const Problem& problem);

// The op's output and what its backward reads: the output, the kept tensor, and the
// GroupNorm mean and rstd of the activation, [batch, num_groups] in statistics_type().
using ForwardForBackward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// GroupNorm's accumulation type: float64 for float64, else float32.
inline at::ScalarType statistics_type(at::ScalarType type) { return type == at::kDouble ? at::kDouble : at::kFloat; }
ForwardForBackward reference_forward_for_backward(const OpArgs& args, KeptTensor kept);

// The activation (N, C, D*sD, H*sH, W*sW) in space-to-depth order
// (KeptTensor::kActivationSpaceToDepth), and back (channels_last_3d).
at::Tensor activation_to_space_to_depth(const at::Tensor& activation, at::IntArrayRef stride);
at::Tensor activation_from_space_to_depth(const at::Tensor& kept);

// What a call in grad mode keeps, read once per call by the autograd kernel, which
// passes it to the op keeping for the backward: on CUDA, float16, bfloat16 or float32
// calls that the fused path takes whatever their sizes are not (float32 in float32 mode
// "pytorch", the fused path turned off, a GPU other than sm_90) keep the convolution's
// output, which the fallback writes anyway (the activation would be one more write of
// the output's size); calls the fused path would run as its pixel-shuffle GEMM keep the
// activation in the order that GEMM writes it (the output in pixel order is then its only
// other write); every other call keeps the activation.
KeptTensor kept_for_backward(const OpArgs& args);

// The gradients of the convolution's output z (with its bias; the activation's dtype,
// channels_last_3d), of gamma, beta and the conv bias ([channels] in statistics_type() each; gamma's
// and beta's as if they were given when they are not), from the output gradient and
// what reference_forward_for_backward keeps.
using ReluGroupNormGradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
ReluGroupNormGradients reference_relu_group_norm_backward(const at::Tensor& grad_output, const at::Tensor& activation,
                                                          const at::Tensor& mean, const at::Tensor& rstd,
                                                          const std::optional<at::Tensor>& norm_weight,
                                                          int64_t num_groups);

// self in channels_last_3d (channels_last) or the contiguous format, always a new tensor
// (the backward's layout changes between the kernels and cuDNN's channels-last algorithms).
at::Tensor reference_convert_memory_format(const at::Tensor& self, bool channels_last);

// A transposed convolution's geometry, as the backward's convolution-gradient ops take it.
struct ConvTransposeGeometry {
  at::IntArrayRef stride, padding, output_padding, dilation;
  int64_t groups;
};
// The Problem of ConvTranspose3d(input, weight) with that geometry (the GroupNorm fields
// left at their defaults); symbolic sizes are specialized.
Problem conv_transpose_problem(const at::Tensor& input, const at::Tensor& weight, const ConvTransposeGeometry& g);

// The gradients of ConvTranspose3d(input, weight) from grad_output through ATen's
// convolution_backward: the input's (channels-last) and the weight's (channels-last).
at::Tensor reference_conv_transpose3d_input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& weight, const ConvTransposeGeometry& g);
at::Tensor reference_conv_transpose3d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                  const at::Tensor& weight, const ConvTransposeGeometry& g);

// What explain() says of calls that run reference_forward, and of calls keeping what
// the backward reads that run reference_forward_for_backward.
inline constexpr const char* kReferenceDescription = "reference: ATen conv_transpose3d + relu + group_norm";
inline constexpr const char* kReferenceForBackwardDescription =
    "reference: ATen conv_transpose3d + relu + group_norm (keeping for the backward: a channels-last copy of the "
    "activation and GroupNorm's mean and rstd)";
inline constexpr const char* kReferenceKeepingConvOutputDescription =
    "reference: ATen conv_transpose3d without bias, then bias + relu + group_norm (keeping for the backward: the "
    "convolution's output and GroupNorm's mean and rstd)";
inline constexpr const char* kReferenceKeepingSpaceToDepthDescription =
    "reference: ATen conv_transpose3d + relu + group_norm (keeping for the backward: the activation copied to "
    "space-to-depth order and GroupNorm's mean and rstd)";
inline const char* reference_for_backward_description(KeptTensor kept) {
  switch (kept) {
    case KeptTensor::kConvOutput: return kReferenceKeepingConvOutputDescription;
    case KeptTensor::kActivationSpaceToDepth: return kReferenceKeepingSpaceToDepthDescription;
    case KeptTensor::kActivation: break;
  }
  return kReferenceForBackwardDescription;
}

#if CUTLASSFUSE_WITH_CUDA
// The op's CUDA kernel: the first kernel path that takes the call (dispatch/routing.cpp),
// else reference_forward.
at::Tensor forward_cuda(const OpArgs& args);
// forward_cuda keeping what the backward reads (reference_forward_for_backward's
// results, written by the kernel path that takes the call).
ForwardForBackward forward_for_backward_cuda(const OpArgs& args, KeptTensor kept);
ReluGroupNormGradients relu_group_norm_backward_cuda(const at::Tensor& grad_output, const at::Tensor& activation,
                                                     const at::Tensor& mean, const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& norm_weight, int64_t num_groups);
// reference_convert_memory_format, through this project's transposes (common/layout.h)
// for 5-D float16 and bfloat16 tensors between NCDHW and NDHWC.
at::Tensor convert_memory_format_cuda(const at::Tensor& self, bool channels_last);
// The reference_conv_transpose3d_*_grad results through this project's CUTLASS kernels
// (sm90/conv_gradients.h); raise where those do not take the layer.
at::Tensor cutlass_conv_transpose3d_input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                               const at::Tensor& weight, const ConvTransposeGeometry& g);
at::Tensor cutlass_conv_transpose3d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                const at::Tensor& weight, const ConvTransposeGeometry& g);
// Which path forward_cuda takes for these arguments, what it runs, and why the paths
// preferred to it do not take the call; explain_for_backward_cuda the same of
// forward_for_backward_cuda, with what the call keeps.
std::string explain_cuda(const OpArgs& args);
std::string explain_for_backward_cuda(const OpArgs& args);
#if CUTLASSFUSE_WITH_BASELINE_KERNELS
// ConvTranspose3d alone through the stock CUTLASS sm90 dgrad (plain store, NDHWC
// output): the baseline of the fused epilogue, for benchmarks (built with
// CUTLASSFUSE_BASELINE_KERNELS=ON).
at::Tensor cutlass_dgrad_plain(const OpArgs& args);
#endif
#endif

}  // namespace cutlassfuse
