// The op's CUDA kernel: the first kernel path of the table that takes the call runs it.
#include <ATen/core/LegacyTypeDispatch.h>

#include <span>

#include "cutlassfuse/common/nvtx.h"
#include "dispatch/kernel_path.h"
#include "fallback/fallback_path.h"
#include "sm90/fused_path.h"

namespace cutlassfuse {
namespace {

// In order of preference.
constexpr KernelPath kKernelPaths[] = {
    {"fused_sm90", &sm90::plan_fused_call},
    {"fallback", &plan_fallback_call},
};

// The first path's plan that takes the call (nullptr if none), and why the ones
// before it did not.
struct Routed {
  const KernelPath* path = nullptr;
  std::unique_ptr<PlannedCall> plan;
  std::string why_not_earlier;
};

Routed route(const Call& call) {
  Routed routed;
  for (const KernelPath& path : kKernelPaths) {
    Routing r = path.plan(call);
    if (auto* plan = std::get_if<std::unique_ptr<PlannedCall>>(&r)) {
      routed.path = &path;
      routed.plan = std::move(*plan);
      return routed;
    }
    routed.why_not_earlier += (routed.why_not_earlier.empty() ? "" : " and ") + std::get<std::string>(r);
  }
  return routed;
}

}  // namespace

at::Tensor forward_cuda(const OpArgs& args) {
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const Routed routed = [&] {
    const NvtxRange range("cutlassfuse.route");
    return route({args, problem, options});
  }();
  if (routed.plan) return routed.plan->run().out;
  const NvtxRange range("cutlassfuse.reference");
  return reference_forward(args);
}

ForwardForBackward forward_for_backward_cuda(const OpArgs& args) {
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const Routed routed = route({args, problem, options, /*keep_for_backward=*/true});
  if (!routed.plan) return reference_forward_for_backward(args);
  ForwardOutputs o = routed.plan->run();
  return {std::move(o.out), std::move(o.activation), std::move(o.mean), std::move(o.rstd)};
}

namespace {

std::string explain(const OpArgs& args, bool keep_for_backward) {
  const Problem problem = validate_and_describe(args);
  const CallOptions options = current_options();
  const Routed routed = route({args, problem, options, keep_for_backward});
  const std::string because = routed.why_not_earlier.empty() ? "" : ", because " + routed.why_not_earlier;
  if (routed.plan) return std::string(routed.path->name) + ": " + routed.plan->description() + because;
  return std::string(keep_for_backward ? kReferenceForBackwardDescription : kReferenceDescription) + because;
}

}  // namespace

std::string explain_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/false); }

std::string explain_for_backward_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/true); }

}  // namespace cutlassfuse
