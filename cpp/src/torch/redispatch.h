// The op's typed dispatcher handle, for the kernels that call it again below their own
// dispatch key (autograd.cpp, autocast.cpp), and its optional tensors.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace cutlassfuse {

using OptionalTensor = std::optional<at::Tensor>;

inline bool present(const OptionalTensor& t) { return t.has_value() && t->defined(); }

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

}  // namespace cutlassfuse
