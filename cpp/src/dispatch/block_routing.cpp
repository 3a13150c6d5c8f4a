// The block family's CUDA kernel: the first kernel path of the table that takes the
// call runs it.
#include <ATen/core/LegacyTypeDispatch.h>

#include "cutlassfuse/common/nvtx.h"
#include "dispatch/block_path.h"
#include "fallback/fallback_path.h"
#include "sm90/fused_block.h"

namespace cutlassfuse {
namespace {

// In order of preference.
constexpr BlockKernelPath kBlockKernelPaths[] = {
    {"fused_sm90", &sm90::plan_fused_block},
    {"fallback", &plan_fallback_block},
};

struct RoutedBlock {
  const BlockKernelPath* path = nullptr;
  std::unique_ptr<PlannedBlock> plan;
  std::string why_not_earlier;
};

RoutedBlock route(const BlockCall& call) {
  RoutedBlock routed;
  for (const BlockKernelPath& path : kBlockKernelPaths) {
    BlockRouting r = path.plan(call);
    if (auto* plan = std::get_if<std::unique_ptr<PlannedBlock>>(&r)) {
      routed.path = &path;
      routed.plan = std::move(*plan);
      return routed;
    }
    routed.why_not_earlier += (routed.why_not_earlier.empty() ? "" : " and ") + std::get<std::string>(r);
  }
  return routed;
}

}  // namespace

at::Tensor block_forward_cuda(const ConvNormActivationArgs& a) {
  const BlockProblem b = validate_block(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const RoutedBlock routed = route({a, b, options});
  if (!routed.plan) return reference_block_forward(a);
  return std::get<0>(routed.plan->run());
}

BlockForBackward block_forward_for_backward_cuda(const ConvNormActivationArgs& a) {
  const BlockProblem b = validate_block(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const RoutedBlock routed = route({a, b, options, /*keep_for_backward=*/true});
  if (!routed.plan) return reference_block_forward_for_backward(a);
  return routed.plan->run();
}

std::string explain_block_cuda(const ConvNormActivationArgs& a) {
  const BlockProblem b = validate_block(a);
  const CallOptions options = current_options();
  const RoutedBlock routed = route({a, b, options});
  const std::string because = routed.why_not_earlier.empty() ? "" : ", because " + routed.why_not_earlier;
  if (routed.plan) return std::string(routed.path->name) + ": " + routed.plan->description() + because;
  return std::string(kBlockReferenceDescription) + because;
}

}  // namespace cutlassfuse
