// The transposed convolution's input and weight gradients from dz, the gradient of its
// output.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <utility>

#include "cutlassfuse/op.h"

namespace cutlassfuse {

// Each gradient through ATen's convolution_backward (cuDNN on CUDA, under PyTorch's
// switches) or this project's CUTLASS conv-gradient kernels (conv_transpose3d_input_grad
// / _weight_grad): on sm_90 in float16 and bfloat16, with concrete sizes, where they
// take the layer and are preferred (strided layers, sm90/conv_gradients.h) or
// cutlassfuse.backends' conv_gradients asks for them. In float16 and bfloat16 on CUDA
// the operands go channels-last, where the kernels run without layout changes of their
// own (dz already is: relu_group_norm_backward writes it so), and the input gradient
// comes back in the input's memory format; the changes go through
// convert_memory_format. Only the gradients `need` asks for are computed. dz is taken
// over, and released with the channels-last input before the input gradient's layout
// change, so that the peak holds one of the three.
std::pair<at::Tensor, at::Tensor> conv_transpose3d_backward(at::Tensor dz, const at::Tensor& input,
                                                            const at::Tensor& weight, const ConvTransposeGeometry& g,
                                                            std::array<bool, 2> need);

// A convolution's (either kind's) input and weight gradients through ATen's
// convolution_backward. A channels-last float16/bfloat16 dz on CUDA (the block family's
// backward writes it so) convolves a channels-last copy of an NCDHW input, not the
// NCDHW operands that cuDNN's half-precision kernels would transpose one by one, and
// the input gradient comes back in the input's memory format.
std::pair<at::Tensor, at::Tensor> convolution_backward(at::Tensor dz, const at::Tensor& input, const at::Tensor& weight,
                                                       const ConvTransposeGeometry& g, bool transposed,
                                                       std::array<bool, 2> need);

}  // namespace cutlassfuse
