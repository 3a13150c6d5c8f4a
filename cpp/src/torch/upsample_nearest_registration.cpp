// The nearest upsampling's schema and per-backend kernels. ATen's upsample_nearest3d is
// its reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels), and
// what a call that autograd records runs, forward-mode AD included: its derivatives are
// ATen's. Every kernel returns the output in the input's suggested memory format.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <optional>

#include "torch/upsample_nearest.h"

namespace cutlassfuse {
namespace {

using UpsampleSignature = at::Tensor(const at::Tensor&, at::IntArrayRef, std::optional<double>, std::optional<double>,
                                     std::optional<double>);

// ATen's differentiable upsampling where autograd records the call (grad mode and an
// input requiring grad, or a forward-mode tangent); otherwise the op below autograd.
at::Tensor upsample_nearest3d_autograd(const at::Tensor& input, at::IntArrayRef output_size,
                                       std::optional<double> scales_d, std::optional<double> scales_h,
                                       std::optional<double> scales_w) {
  if ((at::GradMode::is_enabled() && input.requires_grad()) || torch::autograd::isFwGradDefined(input))
    return aten_upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::upsample_nearest3d", "").typed<UpsampleSignature>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, output_size, scales_d, scales_h, scales_w);
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
