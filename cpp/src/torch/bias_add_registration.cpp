// The bias add's schema and per-backend kernels. ATen's adds are its reference (the CPU
// kernel, and the CUDA kernel of a build without CUDA kernels), and what a call that
// autograd records runs, forward-mode AD included: its derivatives are ATen's.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <optional>

#include "torch/bias_add.h"

namespace cutlassfuse {
namespace {

using BiasAddSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);

bool recorded(const at::Tensor& t) {
  return (at::GradMode::is_enabled() && t.requires_grad()) || torch::autograd::isFwGradDefined(t);
}

// ATen's differentiable adds where autograd records the call (grad mode and a tensor
// requiring grad, or a forward-mode tangent); otherwise the op below autograd.
at::Tensor bias_add_autograd(const at::Tensor& input, const at::Tensor& bias,
                             const std::optional<at::Tensor>& residual) {
  if (recorded(input) || recorded(bias) || (residual && recorded(*residual)))
    return aten_bias_add(input, bias, residual);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::bias_add", "").typed<BiasAddSignature>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, bias, residual);
}

}  // namespace

at::Tensor aten_bias_add(const at::Tensor& input, const at::Tensor& bias, const std::optional<at::Tensor>& residual) {
  TORCH_CHECK(input.dim() >= 2, "cutlassfuse.bias_add: input must have a channel dimension (N, C, ...), got ",
              input.dim(), " dimension(s)");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == input.size(1), "cutlassfuse.bias_add: bias must hold one value per ",
              "channel of the input (", input.size(1), "), got shape ", bias.sizes());
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  at::Tensor out = input + bias.reshape(shape);
  return residual ? out + *residual : out;
}

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // A convolution's bias added after it, then a residual where one is given:
  // input + bias.view(1, C, 1, ...) (+ residual).
  m.def("bias_add(Tensor input, Tensor bias, Tensor? residual=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("bias_add", &aten_bias_add); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("bias_add", &bias_add_cuda);
#else
  m.impl("bias_add", &aten_bias_add);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("bias_add", &bias_add_autograd); }

}  // namespace cutlassfuse
