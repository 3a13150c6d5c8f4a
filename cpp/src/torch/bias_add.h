// torch.ops.cutlassfuse.bias_add (bias_add_registration.cpp): input + bias per channel
// (dimension 1), plus an optional residual, as ATen computes a convolution's bias add and
// a residual add after it; through this project's one-pass kernel on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace cutlassfuse {

// The op's reference and its kernel outside the CUDA kernel's scope: ATen's bias add as
// after a convolution (the bias broadcast over every dimension but 1), then the residual
// add, each rounded to the element type. Raises PyTorch's errors on tensors that do not
// broadcast.
at::Tensor aten_bias_add(const at::Tensor& input, const at::Tensor& bias, const std::optional<at::Tensor>& residual);

// The op's CUDA kernel (common/bias_add_op.cpp).
at::Tensor bias_add_cuda(const at::Tensor& input, const at::Tensor& bias, const std::optional<at::Tensor>& residual);

}  // namespace cutlassfuse
