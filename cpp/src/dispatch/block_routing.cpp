// The block family's CUDA kernel: the first kernel path of the table that takes the
// call runs it.
#include <ATen/core/LegacyTypeDispatch.h>

#include "dispatch/block_path.h"
#include "dispatch/route.h"
#include "fallback/fallback_path.h"
#include "sm90/fused_block.h"

namespace cutlassfuse {
namespace {

// In order of preference.
constexpr BlockKernelPath kBlockKernelPaths[] = {
    {"fused_sm90", &sm90::plan_fused_block},
    {"fallback", &plan_fallback_block},
};

Routed<BlockKernelPath, PlannedBlock> route(const BlockCall& call) {
  return route_first<PlannedBlock>(kBlockKernelPaths, call);
}

// What a call's residual costs besides the add in the normalize: a copy where it is in
// the other layout than the output.
std::string residual_explanation(const ConvNormActivationArgs& a) {
  if (!has_residual(a)) return "";
  const bool converted = !a.residual->is_contiguous(block_output_memory_format(a));
  return std::string("; the residual added as the output is written") +
         (converted ? " (a copy of it in the output's layout first)" : "");
}

std::string explain_block(const ConvNormActivationArgs& a, bool keep_for_backward) {
  const BlockProblem b = validate_block(a);
  const CallOptions options = current_options();
  return route({a, b, options, keep_for_backward}).explanation(kBlockReferenceDescription) + residual_explanation(a);
}

}  // namespace

at::Tensor block_forward_cuda(const ConvNormActivationArgs& a) {
  const BlockProblem b = validate_block(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const auto routed = route({a, b, options});
  if (!routed.plan) return reference_block_forward(a);
  return std::get<0>(routed.plan->run());
}

BlockForBackward block_forward_for_backward_cuda(const ConvNormActivationArgs& a) {
  const BlockProblem b = validate_block(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const auto routed = route({a, b, options, /*keep_for_backward=*/true});
  if (!routed.plan) return reference_block_forward_for_backward(a);
  return routed.plan->run();
}

std::string explain_block_cuda(const ConvNormActivationArgs& a) { return explain_block(a, false); }

std::string explain_block_for_backward_cuda(const ConvNormActivationArgs& a) { return explain_block(a, true); }

}  // namespace cutlassfuse
