// The block family's ops' arguments, as their schemas list them, unpacked into the
// argument structs (block.h) that every kernel takes: one signature per op for every
// kernel, whether the dispatcher calls it (block_registration.cpp) or Python does
// (python_module.cpp); and the ops' Autograd-key kernels (block_autograd.cpp).
#pragma once

#include "cutlassfuse/block.h"
#include "torch/block_redispatch.h"

namespace cutlassfuse {

template <class Result, Result (*Impl)(const ConvNormActivationArgs&)>
Result block_kernel(CUTLASSFUSE_BLOCK_PARAMETERS) {
  return Impl({{input, weight, bias, stride, padding, output_padding, groups, dilation, transposed},
               num_groups,
               norm_weight,
               norm_bias,
               eps,
               {activation, activation_parameter, activation_weight},
               activation_before_norm,
               packed_weight,
               residual});
}

template <class Result, Result (*Impl)(const NormActivationArgs&)>
Result norm_kernel(CUTLASSFUSE_NORM_PARAMETERS) {
  return Impl({input, num_groups, norm_weight, norm_bias, eps, {activation, activation_parameter, activation_weight}});
}

// The ops' Autograd kernels as the modules' direct calls take them (python_module.cpp):
// they record the call for its backward, the forward the op's CUDA kernel called directly
// where the registered Autograd kernels go through the dispatcher below autograd.
at::Tensor conv3d_norm_activation_autograd_cuda(CUTLASSFUSE_BLOCK_PARAMETERS);
at::Tensor group_norm_activation_autograd_cuda(CUTLASSFUSE_NORM_PARAMETERS);

}  // namespace cutlassfuse
