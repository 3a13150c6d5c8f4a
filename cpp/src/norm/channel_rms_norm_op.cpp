// torch.ops.cutlassfuse.channel_rms_norm's CUDA kernel: this project's kernel
// (cutlassfuse/norm/channel_rms_norm.h) for dense 16-bit or float32 input (channels-last:
// channels a multiple of 8 up to 1024), ATen's ops for every other call.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>
#include <utility>

#include "common/packed_input.h"
#include "cutlassfuse/norm/channel_rms_norm.h"
#include "dispatch/op_arguments.h"
#include "torch/channel_rms_norm.h"

namespace cutlassfuse {
namespace {

// A dense tensor's memory as ChannelRMSNorm's layout: the dimensions with strides below the
// channels' hold `pixels` adjacent elements (the channels' stride), those above it
// `planes` blocks of C of them; channels-last where the channels are innermost. The
// kernel normalizes each memory position's pixel, whatever the logical order of planes
// and pixels, and the output has the input's strides.
void set_layout(ChannelRMSNorm& p, const at::Tensor& t) {
  p.channels = t.size(1);
  p.pixels = p.channels == 1 ? t.numel() : t.stride(1);
  p.planes = t.numel() / (p.channels * p.pixels);
  p.channels_last = p.channels > 1 && p.pixels == 1;
  if (p.channels_last) std::swap(p.planes, p.pixels);  // one plane of pixels, channels adjacent
}

// The problem where the kernel takes the call (a valid one); weight and bias read through
// contiguous copies kept alive by `weight_data` and `bias_data` if needed.
std::optional<ChannelRMSNorm> kernel_problem(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                             ActivationKind kind, double parameter,
                                             std::optional<at::Tensor>& weight_data,
                                             std::optional<at::Tensor>& bias_data) {
  const std::optional<ElementType> element = element_type(input.scalar_type());
  const std::optional<ElementType> affine = affine_element_type(weight, bias);
  if (!element || !affine || input.is_neg() || input.is_conj() || input.numel() == 0 ||
      !input.is_non_overlapping_and_dense() ||
      reinterpret_cast<uintptr_t>(input.const_data_ptr()) % input.element_size())
    return std::nullopt;
  ChannelRMSNorm p;
  set_layout(p, input);
  if (p.channels_last && !aligned_16(input)) return std::nullopt;
  p.element = *element;
  p.eps = static_cast<float>(eps);
  p.clamp = clamp;
  p.affine_element = *affine;
  p.weight = data_or_null(weight, weight_data);
  p.bias = data_or_null(bias, bias_data);
  p.activation = {kind, static_cast<float>(parameter)};
  if (!channel_rms_norm_takes(p)) return std::nullopt;
  return p;
}

}  // namespace

at::Tensor channel_rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                 c10::string_view activation, double activation_parameter) {
  const ActivationKind kind = check_channel_rms_norm(input, weight, bias, eps, activation);
  const c10::cuda::CUDAGuard device_guard(input.device());
  std::optional<at::Tensor> weight_data, bias_data;
  const std::optional<ChannelRMSNorm> p =
      kernel_problem(input, weight, bias, eps, clamp, kind, activation_parameter, weight_data, bias_data);
  if (!p) return aten_channel_rms_norm(input, weight, bias, eps, clamp, activation, activation_parameter);
  at::Tensor out = at::empty_like(input);  // the input's strides (dense, non-overlapping)
  channel_rms_norm(input.const_data_ptr(), out.data_ptr(), *p, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
