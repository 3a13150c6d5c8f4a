// The replicate pad's schema and per-backend kernels. ATen's replication_pad3d is its
// reference (the CPU kernel, and the CUDA kernel of a build without CUDA kernels), and
// what a call with a forward-mode tangent runs. A call that autograd records runs the op's
// own kernel and records ATen's derivative (replication_pad3d_backward, itself
// differentiable). Every kernel returns the output in the input's suggested memory format,
// as ATen's CPU kernel does (its CUDA kernel and its meta function may not).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "torch/autograd_node.h"
#include "torch/replication_pad.h"

namespace cutlassfuse {
namespace {

using ReplicationPadSignature = at::Tensor(const at::Tensor&, at::IntArrayRef);

// ATen's derivative of the pad, from the saved input (whose sizes it reads, as ATen's
// node saves it).
struct ReplicationPad3dBackward final : torch::autograd::Node {
  torch::autograd::SavedVariable input;
  std::vector<int64_t> padding;

  std::string name() const override { return "CutlassfuseReplicationPad3DBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined() || !task_should_compute_output(0)) return torch::autograd::variable_list(1);
    return {at::replication_pad3d_backward(grads[0], input.unpack(), padding)};
  }

  void release_variables() override { input.reset_data(); }
};

// The op below autograd; where autograd records the call, ATen's derivative as its node.
// A forward-mode tangent takes ATen's differentiable pad.
at::Tensor replication_pad3d_autograd(const at::Tensor& input, at::IntArrayRef padding) {
  if (torch::autograd::isFwGradDefined(input)) return aten_replication_pad3d(input, padding);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::replication_pad3d", "")
                             .typed<ReplicationPadSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, padding);
  }();
  if (at::GradMode::is_enabled() && input.requires_grad()) {
    record_node<ReplicationPad3dBackward>(
        out,
        [&](ReplicationPad3dBackward& n) {
          n.input = torch::autograd::SavedVariable(input, false);
          n.padding = padding.vec();
        },
        input);
  }
  return out;
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
