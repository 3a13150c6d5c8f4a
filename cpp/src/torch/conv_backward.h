// The transposed convolution's input and weight gradients from dz, the gradient of its
// output.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <utility>

namespace cutlassfuse {

struct ConvTransposeShape {
  std::vector<int64_t> stride, padding, output_padding, dilation;
  int64_t groups;
};

// Where the weight's extent equals the stride, without padding, output padding,
// dilation or groups, each input pixel alone makes a disjoint block of output pixels:
// both gradients are single GEMMs over the input pixels with dz in space-to-depth
// order, [pixels, blocks * Cout]: dx = dz' W'^T, dW' = x^T dz' (W' the weight as
// [Cin, blocks * Cout]). Elsewhere ATen's convolution_backward (cuDNN on CUDA, under
// PyTorch's switches). Only the gradients `need` asks for are computed.
std::pair<at::Tensor, at::Tensor> conv_transpose3d_backward(const at::Tensor& dz, const at::Tensor& input,
                                                            const at::Tensor& weight, const ConvTransposeShape& shape,
                                                            std::array<bool, 2> need);

}  // namespace cutlassfuse
