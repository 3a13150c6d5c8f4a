// A convolution's input and weight gradients from dz, the gradient of its output.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <utility>

#include "cutlassfuse/op.h"

namespace cutlassfuse {

// A convolution's (transposed or not) input and weight gradients from dz, the gradient
// of its output, each through ATen's convolution_backward (cuDNN on CUDA, under
// PyTorch's switches) or, with `cutlass_kernels`, for a transposed convolution, this
// project's CUTLASS conv-gradient kernels (conv_transpose3d_input_grad / _weight_grad):
// on sm_90 in float16 and bfloat16, with concrete sizes, where they take the layer and
// are preferred (strided layers, sm90/conv_gradients.h) or cutlassfuse.backends'
// conv_gradients asks for them. In float16 and bfloat16 on CUDA the operands go
// channels-last, where the kernels (cuDNN's too, which would transpose NCDHW operands
// themselves) run without layout changes of their own (dz already is: the ReLU/GroupNorm
// and block backwards write it so), and the input gradient comes back in the input's
// memory format; the changes go through convert_memory_format. Only the gradients `need`
// asks for are computed. dz is taken over, and released with the channels-last input
// before the input gradient's layout change, so that the peak holds one of the three.
std::pair<at::Tensor, at::Tensor> convolution_backward(at::Tensor dz, const at::Tensor& input, const at::Tensor& weight,
                                                       const ConvTransposeGeometry& g, bool transposed,
                                                       std::array<bool, 2> need, bool cutlass_kernels);

}  // namespace cutlassfuse
