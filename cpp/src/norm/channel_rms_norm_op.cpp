// torch.ops.cutlassfuse.channel_rms_norm's CUDA kernel: this project's kernel
// (cutlassfuse/norm/channel_rms_norm.h) for 16-bit or float32 input packed NC... or
// channels-last, ATen's ops for every other call.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>

#include "common/packed_input.h"
#include "cutlassfuse/norm/channel_rms_norm.h"
#include "dispatch/op_arguments.h"
#include "torch/channel_rms_norm.h"

namespace cutlassfuse {
namespace {

// Whether `t` holds its channels innermost, densely: (N, pixels, C) in memory.
bool channels_innermost(const at::Tensor& t) { return t.dim() >= 3 && t.movedim(1, -1).is_contiguous(); }

// The problem where the kernel takes the call (a valid one).
std::optional<ChannelRMSNorm> kernel_problem(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                             const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                             ActivationKind kind, double parameter) {
  const std::optional<ElementType> element = element_type(input.scalar_type());
  const std::optional<ElementType> affine = affine_element_type(weight, bias);
  if (!element || !affine || input.is_neg() || input.is_conj() || input.numel() == 0) return std::nullopt;
  ChannelRMSNorm p;
  p.batch = input.size(0);
  p.channels = input.size(1);
  p.pixels = input.numel() / (p.batch * p.channels);
  p.element = *element;
  p.channels_last = !input.is_contiguous() && channels_innermost(input);
  if (!input.is_contiguous() && !(p.channels_last && aligned_16(input))) return std::nullopt;
  p.eps = static_cast<float>(eps);
  p.clamp = clamp;
  p.affine_element = *affine;
  p.activation = {kind, static_cast<float>(parameter)};
  if (!channel_rms_norm_takes(p)) return std::nullopt;
  return p;
}

}  // namespace

at::Tensor channel_rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                 c10::string_view activation, double activation_parameter) {
  const ActivationKind kind = check_channel_rms_norm(input, weight, bias, eps, activation);
  std::optional<ChannelRMSNorm> p = kernel_problem(input, weight, bias, eps, clamp, kind, activation_parameter);
  if (!p) return aten_channel_rms_norm(input, weight, bias, eps, clamp, activation, activation_parameter);
  const c10::cuda::CUDAGuard device_guard(input.device());
  std::optional<at::Tensor> weight_data, bias_data;
  p->weight = data_or_null(weight, weight_data);
  p->bias = data_or_null(bias, bias_data);
  at::Tensor out = at::empty_like(input);  // the input's strides (dense)
  channel_rms_norm(input.const_data_ptr(), out.data_ptr(), *p, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
