// The op's arguments, as its schemas list them (registration.cpp), unpacked into OpArgs
// (op.h) for every kernel, whether the dispatcher calls it or Python does
// (python_module.cpp); and the op's Autograd-key kernel (autograd.cpp).
#pragma once

#include "cutlassfuse/op.h"
#include "torch/redispatch.h"

#define CUTLASSFUSE_OP_PARAMETERS                                                                                   \
  const at::Tensor &input, const at::Tensor &weight, const OptionalTensor &bias, const OptionalTensor &norm_weight, \
      const OptionalTensor &norm_bias, int64_t num_groups, double eps, at::IntArrayRef stride,                      \
      at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,            \
      const OptionalTensor &packed_weight, const OptionalTensor &packed_bias
#define CUTLASSFUSE_OP_ARGUMENTS                                                                                   \
  input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding, groups, dilation, \
      packed_weight, packed_bias

namespace cutlassfuse {

template <class Result, Result (*Impl)(const OpArgs&)>
Result kernel(CUTLASSFUSE_OP_PARAMETERS) {
  return Impl({CUTLASSFUSE_OP_ARGUMENTS});
}

// `kernel`, with the keeping op's last arguments.
template <class Result, Result (*Impl)(const OpArgs&, KeptTensor)>
Result keeping_kernel(CUTLASSFUSE_OP_PARAMETERS, bool keep_conv_output, bool keep_space_to_depth) {
  return Impl({CUTLASSFUSE_OP_ARGUMENTS}, kept_tensor(keep_conv_output, keep_space_to_depth));
}

// The op's Autograd kernel as the modules' direct calls take it (python_module.cpp):
// records the call for its backward, its forward the op's CUDA kernel called directly
// where the registered Autograd kernel goes through the dispatcher below autograd.
at::Tensor conv_transpose3d_relu_group_norm_autograd_cuda(CUTLASSFUSE_OP_PARAMETERS);

}  // namespace cutlassfuse
