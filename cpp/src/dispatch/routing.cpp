// The op's CUDA kernel: the first kernel path of the table that takes the call runs it.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/common/nvtx.h"
#include "dispatch/kernel_path.h"
#include "dispatch/route.h"
#include "fallback/fallback_path.h"
#include "sm90/fused_path.h"

namespace cutlassfuse {
namespace {

// In order of preference.
constexpr KernelPath kKernelPaths[] = {
    {"fused_sm90", &sm90::plan_fused_call},
    {"fallback", &plan_fallback_call},
};

Routed<KernelPath, PlannedCall> route(const Call& call) { return route_first<PlannedCall>(kKernelPaths, call); }

}  // namespace

bool keeps_conv_output(const at::Tensor& input) {
  const at::ScalarType type = input.scalar_type();
  if (!input.is_cuda() || (type != at::kHalf && type != at::kBFloat16 && type != at::kFloat)) return false;
  // Whatever the sizes, the fused path takes no such call: the fallback runs it.
  const CallOptions options = current_options();
  if (type == at::kFloat && options.float32_mode == Float32Mode::kPyTorch) return true;
  if (!options.backend.fused_path) return true;
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(input.device().index());
  return props->major != 9 || props->minor != 0;
}

at::Tensor forward_cuda(const OpArgs& args) {
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const auto routed = [&] {
    const NvtxRange range("cutlassfuse.route");
    return route({args, problem, options});
  }();
  if (routed.plan) return routed.plan->run().out;
  const NvtxRange range("cutlassfuse.reference");
  return reference_forward(args);
}

ForwardForBackward forward_for_backward_cuda(const OpArgs& args, bool keep_conv_output) {
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const auto routed = route({args, problem, options, /*keep_for_backward=*/true, keep_conv_output});
  if (!routed.plan) return reference_forward_for_backward(args, keep_conv_output);
  ForwardOutputs o = routed.plan->run();
  return {std::move(o.out), std::move(o.kept), std::move(o.mean), std::move(o.rstd)};
}

namespace {

std::string explain(const OpArgs& args, bool keep_for_backward) {
  const Problem problem = validate_and_describe(args);
  const CallOptions options = current_options();
  const bool keep_conv_output = keep_for_backward && keeps_conv_output(args.input);
  const char* reference = !keep_for_backward ? kReferenceDescription
                          : keep_conv_output ? kReferenceKeepingConvOutputDescription
                                             : kReferenceForBackwardDescription;
  return route({args, problem, options, keep_for_backward, keep_conv_output}).explanation(reference);
}

}  // namespace

std::string explain_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/false); }

std::string explain_for_backward_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/true); }

}  // namespace cutlassfuse
