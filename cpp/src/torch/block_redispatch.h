// The block family's typed dispatcher handles (schemas in block_registration.cpp and
// block_backward_registration.cpp), for the kernels that call an op again below their
// own dispatch key (block_autograd.cpp, autocast.cpp) and the backward.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

#include "torch/redispatch.h"

namespace cutlassfuse {

#define CUTLASSFUSE_BLOCK_PARAMETERS                                                                                 \
  const at::Tensor &input, const at::Tensor &weight, const OptionalTensor &bias, at::IntArrayRef stride,             \
      at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,             \
      bool transposed, int64_t num_groups, const OptionalTensor &norm_weight, const OptionalTensor &norm_bias,       \
      double eps, c10::string_view activation, double activation_parameter, const OptionalTensor &activation_weight, \
      bool activation_before_norm, const OptionalTensor &packed_weight, const OptionalTensor &residual
#define CUTLASSFUSE_BLOCK_ARGUMENTS                                                                               \
  input, weight, bias, stride, padding, output_padding, groups, dilation, transposed, num_groups, norm_weight,    \
      norm_bias, eps, activation, activation_parameter, activation_weight, activation_before_norm, packed_weight, \
      residual

#define CUTLASSFUSE_NORM_PARAMETERS                                                                                \
  const at::Tensor &input, int64_t num_groups, const OptionalTensor &norm_weight, const OptionalTensor &norm_bias, \
      double eps, c10::string_view activation, double activation_parameter, const OptionalTensor &activation_weight
#define CUTLASSFUSE_NORM_ARGUMENTS \
  input, num_groups, norm_weight, norm_bias, eps, activation, activation_parameter, activation_weight

#define CUTLASSFUSE_NORM_BACKWARD_PARAMETERS                                                                          \
  const at::Tensor &grad_output, const at::Tensor &conv_output, const OptionalTensor &bias, const at::Tensor &mean,   \
      const at::Tensor &rstd, const OptionalTensor &norm_weight, const OptionalTensor &norm_bias, int64_t num_groups, \
      c10::string_view activation, double activation_parameter, const OptionalTensor &activation_weight,              \
      bool activation_before_norm

using BlockSignature = at::Tensor(CUTLASSFUSE_BLOCK_PARAMETERS);
using BlockForBackwardSignature =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(CUTLASSFUSE_BLOCK_PARAMETERS);
using NormSignature = at::Tensor(CUTLASSFUSE_NORM_PARAMETERS);
using NormForBackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(CUTLASSFUSE_NORM_PARAMETERS);
using NormBackwardSignature =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(CUTLASSFUSE_NORM_BACKWARD_PARAMETERS);

template <class Signature>
c10::TypedOperatorHandle<Signature> typed_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

inline const c10::TypedOperatorHandle<BlockSignature>& block_op() {
  static const auto op = typed_op<BlockSignature>("cutlassfuse::conv3d_norm_activation");
  return op;
}
inline const c10::TypedOperatorHandle<BlockForBackwardSignature>& block_for_backward_op() {
  static const auto op = typed_op<BlockForBackwardSignature>("cutlassfuse::conv3d_norm_activation_for_backward");
  return op;
}
inline const c10::TypedOperatorHandle<NormSignature>& norm_op() {
  static const auto op = typed_op<NormSignature>("cutlassfuse::group_norm_activation");
  return op;
}
inline const c10::TypedOperatorHandle<NormForBackwardSignature>& norm_for_backward_op() {
  static const auto op = typed_op<NormForBackwardSignature>("cutlassfuse::group_norm_activation_for_backward");
  return op;
}

inline const c10::TypedOperatorHandle<NormBackwardSignature>& norm_activation_backward_op() {
  static const auto op = typed_op<NormBackwardSignature>("cutlassfuse::norm_activation_backward");
  return op;
}

}  // namespace cutlassfuse
