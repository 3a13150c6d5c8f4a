// The op under torch.autocast: the convolution's operands (input, weight, bias) run in
// the autocast dtype, as nn.ConvTranspose3d's do; GroupNorm's gamma and beta are taken
// as they are (the op reads float32 ones). A packed weight or bias made for another
// dtype is dropped (the op then permutes the weight itself): casting it would be a
// second copy per call.
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "torch/redispatch.h"

namespace cutlassfuse {
namespace {

template <c10::DeviceType Device>
at::Tensor forward_autocast(const at::Tensor& input, const at::Tensor& weight, const OptionalTensor& bias,
                            const OptionalTensor& norm_weight, const OptionalTensor& norm_bias, int64_t num_groups,
                            double eps, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                            int64_t groups, at::IntArrayRef dilation, const OptionalTensor& packed_weight,
                            const OptionalTensor& packed_bias) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(Device));
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(Device);
  const auto cast = [&](const at::Tensor& t) { return at::autocast::cached_cast(dtype, t, Device); };
  const at::Tensor cast_weight = cast(weight);
  const OptionalTensor cast_bias = present(bias) ? OptionalTensor(cast(*bias)) : bias;
  const auto matching = [](const OptionalTensor& packed, const OptionalTensor& source) {
    const bool same = present(packed) && present(source) && packed->scalar_type() == source->scalar_type();
    return same ? packed : std::nullopt;
  };
  return fused_op().call(cast(input), cast_weight, cast_bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                         output_padding, groups, dilation, matching(packed_weight, cast_weight),
                         matching(packed_bias, cast_bias));
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlassfuse, AutocastCUDA, m) {
  m.impl("conv_transpose3d_relu_group_norm", &forward_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(cutlassfuse, AutocastCPU, m) {
  m.impl("conv_transpose3d_relu_group_norm", &forward_autocast<c10::DeviceType::CPU>);
}

}  // namespace cutlassfuse
