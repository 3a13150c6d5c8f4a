// The block family's schemas and per-backend kernels (block.h).
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "cutlassfuse/block.h"
#include "torch/block_kernels.h"
#include "torch/block_redispatch.h"

namespace cutlassfuse {
namespace {

// Keyword order and names follow torch.nn.functional.conv3d / conv_transpose3d, then
// group_norm (its weight/bias renamed norm_weight/norm_bias), then the activation.
constexpr const char* kBlockArguments =
    "(Tensor input, Tensor weight, Tensor? bias, int[3] stride, int[3] padding, int[3] output_padding, int groups, "
    "int[3] dilation, bool transposed, int num_groups, Tensor? norm_weight, Tensor? norm_bias, float eps, "
    "str activation, float activation_parameter, Tensor? activation_weight, bool activation_before_norm, "
    "Tensor? packed_weight=None, Tensor? residual=None)";
constexpr const char* kNormArguments =
    "(Tensor input, int num_groups, Tensor? norm_weight, Tensor? norm_bias, float eps, str activation, "
    "float activation_parameter, Tensor? activation_weight)";

std::string schema(const char* name, const char* arguments, const char* result) {
  return std::string(name) + arguments + " -> " + result;
}

// The references behind validation, without ATen's own autograd bookkeeping.
template <class Args, class Result, Result (*Reference)(const Args&), BlockProblem (*Validate)(const Args&)>
Result checked_reference(const Args& args) {
  Validate(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return Reference(args);
}

template <class Args, BlockProblem (*Validate)(const Args&), const char* const* Description>
std::string explain_reference(const Args& args) {
  Validate(args);
  return std::string(*Description) +
         (args.input.is_cuda() ? ", because the library was built without CUDA kernels" : "");
}

template <class Args, BlockProblem (*Validate)(const Args&)>
std::string explain_meta(const Args& args) {
  Validate(args);
  return "meta: the output's shape, dtype and memory format only, no computation";
}

constexpr const char* kBlockDescription = kBlockReferenceDescription;
constexpr const char* kNormDescription = kNormReferenceDescription;

using BlockArgs = ConvNormActivationArgs;
using NormArgs = NormActivationArgs;

// Under torch.autocast the convolution's operands run in the autocast dtype, as
// nn.Conv3d's do, and so does the residual (added to the output, which has their dtype);
// the norm's and the activation's parameters are taken as they are. A packed weight of
// another dtype than the cast weight's is dropped.
template <c10::DeviceType Device>
at::Tensor block_autocast(CUTLASSFUSE_BLOCK_PARAMETERS) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(Device));
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(Device);
  const auto cast = [&](const at::Tensor& t) { return at::autocast::cached_cast(dtype, t, Device); };
  const OptionalTensor cast_bias = present(bias) ? OptionalTensor(cast(*bias)) : bias;
  const OptionalTensor cast_residual = present(residual) ? OptionalTensor(cast(*residual)) : residual;
  const OptionalTensor packed =
      present(packed_weight) && packed_weight->scalar_type() == dtype ? packed_weight : std::nullopt;
  return block_op().call(cast(input), cast(weight), cast_bias, stride, padding, output_padding, groups, dilation,
                         transposed, num_groups, norm_weight, norm_bias, eps, activation, activation_parameter,
                         activation_weight, activation_before_norm, packed, cast_residual);
}

// The references as a backend's kernels: the CPU's, and CUDA's in a build without CUDA
// kernels.
void impl_references(torch::Library& m) {
  m.impl(
      "conv3d_norm_activation",
      &block_kernel<at::Tensor, &checked_reference<BlockArgs, at::Tensor, &reference_block_forward, &validate_block>>);
  m.impl("conv3d_norm_activation_for_backward",
         &block_kernel<BlockForBackward, &checked_reference<BlockArgs, BlockForBackward,
                                                            &reference_block_forward_for_backward, &validate_block>>);
  m.impl("explain_conv3d_norm_activation",
         &block_kernel<std::string, &explain_reference<BlockArgs, &validate_block, &kBlockDescription>>);
  m.impl("explain_conv3d_norm_activation_for_backward",
         &block_kernel<std::string, &explain_reference<BlockArgs, &validate_block, &kBlockDescription>>);
  m.impl("group_norm_activation",
         &norm_kernel<at::Tensor, &checked_reference<NormArgs, at::Tensor, &reference_norm_activation_forward,
                                                     &validate_norm_activation>>);
  m.impl("group_norm_activation_for_backward",
         &norm_kernel<NormForBackward,
                      &checked_reference<NormArgs, NormForBackward, &reference_norm_activation_forward_for_backward,
                                         &validate_norm_activation>>);
  m.impl("explain_group_norm_activation",
         &norm_kernel<std::string, &explain_reference<NormArgs, &validate_norm_activation, &kNormDescription>>);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  m.def(schema("conv3d_norm_activation", kBlockArguments, "Tensor").c_str());
  // The op keeping what its backward reads: (output, the convolution's output without
  // its bias in kept_conv_output_memory_format(), mean, rstd [batch, num_groups]).
  m.def(schema("conv3d_norm_activation_for_backward", kBlockArguments, "(Tensor, Tensor, Tensor, Tensor)").c_str());
  m.def(schema("explain_conv3d_norm_activation", kBlockArguments, "str").c_str());
  m.def(schema("explain_conv3d_norm_activation_for_backward", kBlockArguments, "str").c_str());
  m.def(schema("group_norm_activation", kNormArguments, "Tensor").c_str());
  // (output, mean, rstd).
  m.def(schema("group_norm_activation_for_backward", kNormArguments, "(Tensor, Tensor, Tensor)").c_str());
  m.def(schema("explain_group_norm_activation", kNormArguments, "str").c_str());
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { impl_references(m); }

TORCH_LIBRARY_IMPL(cutlassfuse, Meta, m) {
  m.impl("explain_conv3d_norm_activation", &block_kernel<std::string, &explain_meta<BlockArgs, &validate_block>>);
  m.impl("explain_conv3d_norm_activation_for_backward",
         &block_kernel<std::string, &explain_meta<BlockArgs, &validate_block>>);
  m.impl("explain_group_norm_activation",
         &norm_kernel<std::string, &explain_meta<NormArgs, &validate_norm_activation>>);
}

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("conv3d_norm_activation", &block_kernel<at::Tensor, &block_forward_cuda>);
  m.impl("conv3d_norm_activation_for_backward", &block_kernel<BlockForBackward, &block_forward_for_backward_cuda>);
  m.impl("explain_conv3d_norm_activation", &block_kernel<std::string, &explain_block_cuda>);
  m.impl("explain_conv3d_norm_activation_for_backward", &block_kernel<std::string, &explain_block_for_backward_cuda>);
  m.impl("group_norm_activation", &norm_kernel<at::Tensor, &norm_activation_forward_cuda>);
  m.impl("group_norm_activation_for_backward",
         &norm_kernel<NormForBackward, &norm_activation_forward_for_backward_cuda>);
  m.impl("explain_group_norm_activation", &norm_kernel<std::string, &explain_norm_activation_cuda>);
#else
  impl_references(m);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, AutocastCUDA, m) {
  m.impl("conv3d_norm_activation", &block_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(cutlassfuse, AutocastCPU, m) {
  m.impl("conv3d_norm_activation", &block_autocast<c10::DeviceType::CPU>);
}

}  // namespace cutlassfuse
