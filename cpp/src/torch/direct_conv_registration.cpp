// The direct convolution's schema and per-backend kernels. ATen's convolution is its
// reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels), and
// what a call that autograd records runs, forward-mode AD included: its derivatives are
// ATen's. The modules call the op only where nothing is recorded (few_channel_conv.py).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "torch/direct_conv.h"

namespace cutlassfuse {
namespace {

using DirectConvSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                       at::IntArrayRef, at::IntArrayRef, at::IntArrayRef);

at::Tensor aten_conv3d(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  return at::conv3d(input, weight, bias, stride, padding, dilation, 1);
}

// ATen's differentiable convolution where autograd records the call (grad mode and a
// tensor requiring grad, or a forward-mode tangent); otherwise the op below autograd.
at::Tensor direct_conv3d_autograd(const at::Tensor& input, const at::Tensor& weight,
                                  const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                  at::IntArrayRef padding, at::IntArrayRef dilation) {
  const bool has_bias = bias.has_value() && bias->defined();
  const bool recorded = (at::GradMode::is_enabled() &&
                         (input.requires_grad() || weight.requires_grad() || (has_bias && bias->requires_grad()))) ||
                        torch::autograd::isFwGradDefined(input) || torch::autograd::isFwGradDefined(weight) ||
                        (has_bias && torch::autograd::isFwGradDefined(*bias));
  if (recorded) return aten_conv3d(input, weight, bias, stride, padding, dilation);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::direct_conv3d", "").typed<DirectConvSignature>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, weight, bias, stride, padding, dilation);
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

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("direct_conv3d", &direct_conv3d_autograd); }

}  // namespace cutlassfuse
