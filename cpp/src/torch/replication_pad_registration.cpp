// The replicate pad's schema and per-backend kernels. ATen's replication_pad3d is its
// reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels), and
// what a call that autograd records runs, forward-mode AD included: its derivatives are
// ATen's. Every kernel returns the output in the input's suggested memory format, as
// ATen's CPU kernel does (its CUDA kernel and its meta function may not).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include "torch/replication_pad.h"

namespace cutlassfuse {
namespace {

using ReplicationPadSignature = at::Tensor(const at::Tensor&, at::IntArrayRef);

// ATen's differentiable pad where autograd records the call (grad mode and an input
// requiring grad, or a forward-mode tangent); otherwise the op below autograd.
at::Tensor replication_pad3d_autograd(const at::Tensor& input, at::IntArrayRef padding) {
  if ((at::GradMode::is_enabled() && input.requires_grad()) || torch::autograd::isFwGradDefined(input))
    return aten_replication_pad3d(input, padding);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::replication_pad3d", "")
                             .typed<ReplicationPadSignature>();
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return op.call(input, padding);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // F.pad(input, padding, mode="replicate") with six pads: aten::replication_pad3d.
  m.def("replication_pad3d(Tensor input, int[6] padding) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("replication_pad3d", &aten_replication_pad3d); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("replication_pad3d", &replication_pad3d_cuda);
#else
  m.impl("replication_pad3d", &aten_replication_pad3d);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("replication_pad3d", &replication_pad3d_autograd); }

}  // namespace cutlassfuse
