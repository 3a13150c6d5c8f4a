// The block family's torch-facing operators (schemas in src/torch/block_registration.cpp):
//
//   conv3d_norm_activation: a convolution (nn.Conv3d, or nn.ConvTranspose3d when
//     `transposed`), then GroupNorm (InstanceNorm3d: one channel per group), with an
//     activation (plan/activation.h) before the norm or after it;
//   group_norm_activation: GroupNorm, then an activation, with no convolution in front
//     (a norm that reads a residual sum or a network's input).
//
// Each has a reference (ATen's own kernels, on any device: the CPU kernel and the CUDA
// calls no kernel path takes), a CUDA implementation, and a form that keeps what its
// backward reads (block_autograd.cpp): the convolution's output without its bias, in the
// convolution's layout, and the norm's mean and rstd; the standalone norm keeps mean and
// rstd (its input is saved as it is). Both backwards run
//
//   norm_activation_backward: the gradients of the norm and the activation around it
//     from those, on either device (schema in src/torch/block_backward_registration.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>
#include <string>
#include <string_view>
#include <tuple>

#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// An activation as the schemas pass it: its name, constant and learned slopes.
struct ActivationArgs {
  std::string_view name;
  double parameter;
  const std::optional<at::Tensor>& weight;  // PReLU's slopes
};

// A convolution's operands and geometry as the ops take them (the original op's
// convolution is transposed).
struct ConvolutionArgs {
  const at::Tensor& input;
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  at::IntArrayRef stride;
  at::IntArrayRef padding;
  at::IntArrayRef output_padding;
  int64_t groups;
  at::IntArrayRef dilation;
  bool transposed;
};

// The block's arguments: its convolution's, then the norm's and the activation's.
struct ConvNormActivationArgs : ConvolutionArgs {
  int64_t num_groups;
  const std::optional<at::Tensor>& norm_weight;
  const std::optional<at::Tensor>& norm_bias;
  double eps;
  ActivationArgs activation;
  bool activation_before_norm;
  // The weight in channels_last_3d, equal to it (a module's kept copy); absent: the
  // kernels convert the weight where they read it channels-last.
  const std::optional<at::Tensor>& packed_weight;
  // Added to the block's output (a residual connection: act(norm(conv(x))) + residual),
  // of the output's shape and dtype, in any layout; absent: none.
  const std::optional<at::Tensor>& residual;
};

inline bool has_residual(const ConvNormActivationArgs& a) { return a.residual.has_value() && a.residual->defined(); }

// The residual in the output's memory format, as the normalize reads it; absent: none.
inline std::optional<at::Tensor> residual_in(const ConvNormActivationArgs& a, at::MemoryFormat format) {
  if (!has_residual(a)) return std::nullopt;
  return a.residual->contiguous(format);
}

// The weight as the channels-last convolutions read it: the packed copy when given.
inline at::Tensor channels_last_weight(const ConvNormActivationArgs& a) {
  return a.packed_weight.has_value() && a.packed_weight->defined()
             ? *a.packed_weight
             : a.weight.contiguous(at::MemoryFormat::ChannelsLast3d);
}

struct NormActivationArgs {
  const at::Tensor& input;
  int64_t num_groups;
  const std::optional<at::Tensor>& norm_weight;
  const std::optional<at::Tensor>& norm_bias;
  double eps;
  ActivationArgs activation;
};

// A validated block: the convolution's sizes (Problem, whose output_size is the
// convolution's output for either kind), the norm's groups and eps (in Problem), and
// the activation.
struct BlockProblem {
  Problem conv;
  bool transposed = false;
  ActivationKind activation = ActivationKind::kIdentity;
  ActivationPosition position = ActivationPosition::kAfterNorm;
};

// Check every argument (ValueError/TypeError naming it) before anything runs.
BlockProblem validate_block(const ConvNormActivationArgs& args);
// The standalone norm's sizes: batch, channels, spatial in Problem's output fields.
BlockProblem validate_norm_activation(const NormActivationArgs& args);

// The output's memory format: PyTorch's convolution rule (output_memory_format), or the
// standalone norm's input's.
at::MemoryFormat block_output_memory_format(const ConvNormActivationArgs& args);
// The layout of the convolution output a call keeps for its backward: channels-last for
// float16/bfloat16 on CUDA (the kernels convolve channels-last operands, and an NCDHW
// output is the normalize's transpose), else the output's.
at::MemoryFormat kept_conv_output_memory_format(const ConvNormActivationArgs& args);

// (output, convolution output without bias in kept_conv_output_memory_format(), mean,
// rstd [batch, num_groups] in statistics_type()).
using BlockForBackward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
// (output, mean, rstd).
using NormForBackward = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

at::Tensor reference_block_forward(const ConvNormActivationArgs& args);
BlockForBackward reference_block_forward_for_backward(const ConvNormActivationArgs& args);
at::Tensor reference_norm_activation_forward(const NormActivationArgs& args);
NormForBackward reference_norm_activation_forward_for_backward(const NormActivationArgs& args);

// The activation through ATen's differentiable ops; and its input's gradient (and
// PReLU's slopes' gradient in statistics_type(), else undefined) from the output's, as
// PyTorch's backward kernels compute them.
at::Tensor apply_activation(const at::Tensor& x, ActivationKind kind, double parameter,
                            const std::optional<at::Tensor>& weight);
std::tuple<at::Tensor, at::Tensor> activation_backward(const at::Tensor& grad, const at::Tensor& x, ActivationKind kind,
                                                       double parameter, const std::optional<at::Tensor>& weight);

// norm_activation_backward's arguments: the output gradient and what the forward keeps
// (conv_output: the convolution's output without its bias, or the standalone norm's
// input, with no bias).
struct NormActivationBackwardArgs {
  const at::Tensor& grad_output;
  const at::Tensor& conv_output;
  const std::optional<at::Tensor>& bias;
  const at::Tensor& mean;
  const at::Tensor& rstd;
  const std::optional<at::Tensor>& norm_weight;
  const std::optional<at::Tensor>& norm_bias;
  int64_t num_groups;
  ActivationArgs activation;
  bool activation_before_norm;
};

// Its results: (gradient of conv_output in conv_output's suggested memory format and
// dtype; of gamma, of beta, of the bias, [channels] each, as if gamma = 1 and beta = 0
// were given when they are not; of PReLU's weight, its shape, else shape (0,)), the
// [channels] and PReLU gradients in statistics_type().
using NormActivationGradients = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// The checks of validate_norm_activation, and grad_output, mean and rstd against
// conv_output; the sizes as validate_norm_activation gives them.
BlockProblem validate_norm_activation_backward(const NormActivationBackwardArgs& args);
NormActivationGradients reference_norm_activation_backward(const NormActivationBackwardArgs& args);

inline constexpr const char* kBlockReferenceDescription = "reference: ATen convolution + norm + activation";
inline constexpr const char* kNormReferenceDescription = "reference: ATen group_norm + activation";

#if CUTLASSFUSE_WITH_CUDA
at::Tensor block_forward_cuda(const ConvNormActivationArgs& args);
BlockForBackward block_forward_for_backward_cuda(const ConvNormActivationArgs& args);
std::string explain_block_cuda(const ConvNormActivationArgs& args);
// The same of the call keeping what its backward reads (conv3d_norm_activation_for_backward).
std::string explain_block_for_backward_cuda(const ConvNormActivationArgs& args);
at::Tensor norm_activation_forward_cuda(const NormActivationArgs& args);
NormForBackward norm_activation_forward_for_backward_cuda(const NormActivationArgs& args);
std::string explain_norm_activation_cuda(const NormActivationArgs& args);
// This project's backward kernels (norm/group_norm_backward.h) where they take the call,
// else the reference.
NormActivationGradients norm_activation_backward_cuda(const NormActivationBackwardArgs& args);
#endif

}  // namespace cutlassfuse
