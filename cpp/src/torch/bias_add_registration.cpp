// The bias add's schema and per-backend kernels. ATen's adds are its reference (the CPU
// kernel, and the CUDA kernel of a build without CUDA kernels), and what a call with a
// forward-mode tangent runs. A call that autograd records runs the op's own kernel and
// records the adds' derivatives: the output's gradient for the input and the residual
// (summed over broadcast dimensions), its sum over every dimension but the channels' for
// the bias.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "torch/autograd_node.h"
#include "torch/bias_add.h"

namespace cutlassfuse {
namespace {

using BiasAddSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&);

// The adds' derivatives, each in its tensor's sizes and type.
struct BiasAddBackward final : torch::autograd::Node {
  std::vector<int64_t> input_size, residual_size;
  at::ScalarType input_type = at::kFloat, bias_type = at::kFloat, residual_type = at::kFloat;

  std::string name() const override { return "CutlassfuseBiasAddBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    torch::autograd::variable_list result(num_outputs());
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return result;
    if (task_should_compute_output(0)) result[0] = at::sum_to(grad, input_size).to(input_type);
    if (task_should_compute_output(1)) {
      std::vector<int64_t> others;
      for (int64_t d = 0; d < grad.dim(); ++d) {
        if (d != 1) others.push_back(d);
      }
      result[1] = grad.sum(others).to(bias_type);
    }
    if (task_should_compute_output(2))  // an empty edge without a residual
      result[2] = at::sum_to(grad, residual_size).to(residual_type);
    return result;
  }
};

// The op below autograd; where autograd records the call, the adds' derivatives as its
// node. A forward-mode tangent takes ATen's differentiable adds.
at::Tensor bias_add_autograd(const at::Tensor& input, const at::Tensor& bias,
                             const std::optional<at::Tensor>& residual) {
  if (torch::autograd::isFwGradDefined(input) || torch::autograd::isFwGradDefined(bias) ||
      (residual && torch::autograd::isFwGradDefined(*residual)))
    return aten_bias_add(input, bias, residual);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::bias_add", "").typed<BiasAddSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, bias, residual);
  }();
  if (at::GradMode::is_enabled() &&
      (input.requires_grad() || bias.requires_grad() || (residual && residual->requires_grad()))) {
    record_node<BiasAddBackward>(
        out,
        [&](BiasAddBackward& n) {
          n.input_size = input.sizes().vec();
          n.input_type = input.scalar_type();
          n.bias_type = bias.scalar_type();
          if (residual) {
            n.residual_size = residual->sizes().vec();
            n.residual_type = residual->scalar_type();
          }
        },
        input, bias, residual);
  }
  return out;
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
