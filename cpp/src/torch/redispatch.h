// The op's typed dispatcher handle, for the kernels that call it again below their own
// dispatch key (autograd.cpp, autocast.cpp), and its optional tensors.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

namespace cutlassfuse {

using OptionalTensor = std::optional<at::Tensor>;

inline bool present(const OptionalTensor& t) { return t.has_value() && t->defined(); }
inline at::Tensor or_undefined(const OptionalTensor& t) { return present(t) ? *t : at::Tensor(); }

// The schema's arguments (registration.cpp), in order.
using OpSignature = at::Tensor(const at::Tensor& input, const at::Tensor& weight, const OptionalTensor& bias,
                               const OptionalTensor& norm_weight, const OptionalTensor& norm_bias, int64_t num_groups,
                               double eps, at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,
                               const OptionalTensor& packed_weight, const OptionalTensor& packed_bias);

inline const c10::TypedOperatorHandle<OpSignature>& fused_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::conv_transpose3d_relu_group_norm", "")
                             .typed<OpSignature>();
  return op;
}

// The op keeping what its backward reads, and that backward (registration.cpp).
using Tensors4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using ForBackwardSignature = Tensors4(const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                                      const OptionalTensor&, const OptionalTensor&, int64_t, double, at::IntArrayRef,
                                      at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef, const OptionalTensor&,
                                      const OptionalTensor&, bool keep_conv_output, bool keep_space_to_depth);
inline const c10::TypedOperatorHandle<ForBackwardSignature>& for_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::conv_transpose3d_relu_group_norm_for_backward", "")
                             .typed<ForBackwardSignature>();
  return op;
}

using BackwardSignature = Tensors4(const at::Tensor& grad_output, const at::Tensor& activation, const at::Tensor& mean,
                                   const at::Tensor& rstd, const OptionalTensor& norm_weight, int64_t num_groups);
inline const c10::TypedOperatorHandle<BackwardSignature>& relu_group_norm_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::relu_group_norm_backward", "")
                             .typed<BackwardSignature>();
  return op;
}

using ConvertMemoryFormatSignature = at::Tensor(const at::Tensor& self, bool channels_last);
inline const c10::TypedOperatorHandle<ConvertMemoryFormatSignature>& convert_memory_format_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::convert_memory_format", "")
                             .typed<ConvertMemoryFormatSignature>();
  return op;
}

using GradientSignature = at::Tensor(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                                     at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                                     int64_t groups, at::IntArrayRef dilation);
inline const c10::TypedOperatorHandle<GradientSignature>& input_grad_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::conv_transpose3d_input_grad", "")
                             .typed<GradientSignature>();
  return op;
}
inline const c10::TypedOperatorHandle<GradientSignature>& weight_grad_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::conv_transpose3d_weight_grad", "")
                             .typed<GradientSignature>();
  return op;
}

}  // namespace cutlassfuse
