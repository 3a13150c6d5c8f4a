// The nearest upsampling's schema and per-backend kernels. ATen's upsample_nearest3d is
// its reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels), and
// what a call with a forward-mode tangent runs. A call that autograd records runs the op's
// own kernel and records ATen's derivative (upsample_nearest3d_backward, itself
// differentiable). Every kernel returns the output in the input's suggested memory format.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "torch/autograd_node.h"
#include "torch/upsample_nearest.h"

namespace cutlassfuse {
namespace {

using UpsampleSignature = at::Tensor(const at::Tensor&, at::IntArrayRef, std::optional<double>, std::optional<double>,
                                     std::optional<double>);

// ATen's derivative of the upsampling: each input element's gradient sums those of the
// output elements copied from it.
struct UpsampleNearest3dBackward final : torch::autograd::Node {
  std::vector<int64_t> input_size, output_size;
  std::optional<double> scales_d, scales_h, scales_w;

  std::string name() const override { return "CutlassfuseUpsampleNearest3DBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined() || !task_should_compute_output(0)) return torch::autograd::variable_list(1);
    return {at::upsample_nearest3d_backward(grads[0], output_size, input_size, scales_d, scales_h, scales_w)};
  }
};

// The op below autograd; where autograd records the call, ATen's derivative as its node.
// A forward-mode tangent takes ATen's differentiable upsampling.
at::Tensor upsample_nearest3d_autograd(const at::Tensor& input, at::IntArrayRef output_size,
                                       std::optional<double> scales_d, std::optional<double> scales_h,
                                       std::optional<double> scales_w) {
  if (torch::autograd::isFwGradDefined(input))
    return aten_upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::upsample_nearest3d", "").typed<UpsampleSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, output_size, scales_d, scales_h, scales_w);
  }();
  if (at::GradMode::is_enabled() && input.requires_grad()) {
    auto node = make_node<UpsampleNearest3dBackward>();
    auto* n = static_cast<UpsampleNearest3dBackward*>(node.get());
    n->set_next_edges(torch::autograd::collect_next_edges(input));
    n->input_size = input.sizes().vec();
    n->output_size = output_size.vec();
    n->scales_d = scales_d;
    n->scales_h = scales_h;
    n->scales_w = scales_w;
    torch::autograd::set_history(out, node);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // F.interpolate(input, ..., mode="nearest") on 5-D input: aten::upsample_nearest3d.
  m.def(
      "upsample_nearest3d(Tensor input, int[3] output_size, float? scales_d=None, float? scales_h=None, "
      "float? scales_w=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("upsample_nearest3d", &aten_upsample_nearest3d); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("upsample_nearest3d", &upsample_nearest3d_cuda);
#else
  m.impl("upsample_nearest3d", &aten_upsample_nearest3d);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("upsample_nearest3d", &upsample_nearest3d_autograd); }

}  // namespace cutlassfuse
