// torch.ops.cutlassfuse.direct_conv3d (direct_conv_registration.cpp): F.conv3d with one
// group, through the direct convolution of few channels on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace cutlassfuse {

// The op's CUDA kernel (direct_conv/direct_conv3d_op.cpp).
at::Tensor direct_conv3d_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation);

}  // namespace cutlassfuse
