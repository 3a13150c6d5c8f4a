// The op's CUDA kernel: the first kernel path of the table that takes the call runs it.
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/plan/subpixel.h"
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

namespace {

// Whatever the sizes, the fused path takes no call of this device, dtype and settings.
bool fused_path_refuses(const at::Tensor& input, const CallOptions& options) {
  if (input.scalar_type() == at::kFloat && options.float32_mode == Float32Mode::kPyTorch) return true;
  if (!options.backend.fused_path) return true;
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(input.device().index());
  return props->major != 9 || props->minor != 0;
}

// Whether the call's layer is one of the pixel-shuffle GEMM's (plan/subpixel.h), from
// its arguments before validation; the weight's kernel extents are specialized under
// tracing.
bool pixel_shuffle_geometry(const OpArgs& a) {
  if (a.weight.dim() != 5 || a.stride.size() != 3 || a.padding.size() != 3 || a.output_padding.size() != 3 ||
      a.dilation.size() != 3)
    return false;
  Problem geometry;
  for (int i = 0; i < 3; ++i) {
    geometry.kernel_size[i] = a.weight.sym_size(2 + i).guard_int(__FILE__, __LINE__);
    geometry.stride[i] = a.stride[i];
    geometry.padding[i] = a.padding[i];
    geometry.output_padding[i] = a.output_padding[i];
    geometry.dilation[i] = a.dilation[i];
  }
  geometry.conv_groups = a.groups;
  return is_pixel_shuffle_gemm(geometry);
}

}  // namespace

KeptTensor kept_for_backward(const OpArgs& args) {
  const at::ScalarType type = args.input.scalar_type();
  if (!args.input.is_cuda() || (type != at::kHalf && type != at::kBFloat16 && type != at::kFloat))
    return KeptTensor::kActivation;
  if (fused_path_refuses(args.input, current_options())) return KeptTensor::kConvOutput;
  return pixel_shuffle_geometry(args) ? KeptTensor::kActivationSpaceToDepth : KeptTensor::kActivation;
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

ForwardForBackward forward_for_backward_cuda(const OpArgs& args, KeptTensor kept) {
  const Problem problem = validate_and_describe(args);
  validate_kept(kept, problem);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  const CallOptions options = current_options();
  const auto routed = route({args, problem, options, /*keep_for_backward=*/true, kept});
  if (!routed.plan) return reference_forward_for_backward(args, kept);
  ForwardOutputs o = routed.plan->run();
  return {std::move(o.out), std::move(o.kept), std::move(o.mean), std::move(o.rstd)};
}

namespace {

std::string explain(const OpArgs& args, bool keep_for_backward) {
  const Problem problem = validate_and_describe(args);
  const CallOptions options = current_options();
  const KeptTensor kept = keep_for_backward ? kept_for_backward(args) : KeptTensor::kActivation;
  const char* reference = keep_for_backward ? reference_for_backward_description(kept) : kReferenceDescription;
  return route({args, problem, options, keep_for_backward, kept}).explanation(reference);
}

}  // namespace

std::string explain_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/false); }

std::string explain_for_backward_cuda(const OpArgs& args) { return explain(args, /*keep_for_backward=*/true); }

}  // namespace cutlassfuse
