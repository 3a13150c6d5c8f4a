// The operator's schema and its per-backend kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cutlassfuse/op.h"

namespace cutlassfuse {
namespace {

// Keyword order and names follow torch.nn.functional.conv_transpose3d, then
// torch.nn.functional.group_norm (its weight/bias renamed norm_weight/norm_bias).
constexpr const char* kArguments =
    "(Tensor input, Tensor weight, Tensor? bias, Tensor? norm_weight, Tensor? norm_bias, int num_groups, "
    "float eps, int[3] stride, int[3] padding, int[3] output_padding, int groups, int[3] dilation)";

at::Tensor forward_reference(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& norm_bias,
                       int64_t num_groups, double eps, at::IntArrayRef stride, at::IntArrayRef padding,
                       at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation) {
  const OpArgs args{input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding,
                    groups, dilation};
  validate_and_describe(args);
  // The composite's own autograd bookkeeping is not wanted inside the op.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return reference_forward(args);
}

constexpr const char* kReference = "reference: ATen conv_transpose3d + relu + group_norm";

std::string explain_reference(const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& norm_weight,
                              const std::optional<at::Tensor>& norm_bias, int64_t num_groups, double eps,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                              int64_t groups, at::IntArrayRef dilation) {
  validate_and_describe({input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                         output_padding, groups, dilation});
  const bool cuda_tensor = input.is_cuda();
  return std::string(kReference) + (cuda_tensor ? ", because the library was built without CUDA kernels" : "");
}

#if CUTLASSFUSE_WITH_CUDA
at::Tensor forward_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                        const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& norm_bias,
                        int64_t num_groups, double eps, at::IntArrayRef stride, at::IntArrayRef padding,
                        at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation) {
  const OpArgs args{input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding,
                    groups, dilation};
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (fused_path_unsupported_reason(args, problem).empty()) return fused_forward_cuda(args, problem);
  return reference_forward(args);
}

std::string explain_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& norm_bias,
                         int64_t num_groups, double eps, at::IntArrayRef stride, at::IntArrayRef padding,
                         at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation) {
  const OpArgs args{input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding,
                    groups, dilation};
  const std::string why_not = fused_path_unsupported_reason(args, validate_and_describe(args));
  if (why_not.empty()) return "fused_sm90: CUTLASS dgrad (bias + ReLU epilogue) + GroupNorm stats + normalize";
  return std::string(kReference) + ", because " + why_not;
}
#endif

}  // namespace

TORCH_LIBRARY(cutlassfuse, m) {
  m.def((std::string("conv_transpose3d_relu_group_norm") + kArguments + " -> Tensor").c_str());
  // Which implementation a call with these arguments takes, and why.
  m.def((std::string("explain") + kArguments + " -> str").c_str());
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) {
  m.impl("conv_transpose3d_relu_group_norm", &forward_reference);
  m.impl("explain", &explain_reference);
}

// A library built without the CUDA toolkit still serves CUDA tensors, through ATen.
TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("conv_transpose3d_relu_group_norm", &forward_cuda);
  m.impl("explain", &explain_cuda);
#else
  m.impl("conv_transpose3d_relu_group_norm", &forward_reference);
  m.impl("explain", &explain_reference);
#endif
}

}  // namespace cutlassfuse
