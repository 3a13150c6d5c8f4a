// The direct convolution's schema and per-backend kernels. ATen's convolution is its
// reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels). The
// op has no autograd kernel: the modules call it only where nothing requires grad
// (few_channel_conv.py).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "torch/direct_conv.h"

namespace cutlassfuse {
namespace {

at::Tensor aten_conv3d(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  return at::conv3d(input, weight, bias, stride, padding, dilation, 1);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // F.conv3d(input, weight, bias, stride, padding, dilation) with one group.
  m.def(
      "direct_conv3d(Tensor input, Tensor weight, Tensor? bias, int[3] stride, int[3] padding, int[3] dilation) -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("direct_conv3d", &aten_conv3d); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("direct_conv3d", &direct_conv3d_cuda);
#else
  m.impl("direct_conv3d", &aten_conv3d);
#endif
}

}  // namespace cutlassfuse
