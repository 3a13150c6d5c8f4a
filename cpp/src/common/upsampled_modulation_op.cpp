// torch.ops.cutlassfuse.upsampled_modulation's CUDA kernel: this project's pass
// (cutlassfuse/common/upsampled_modulation.h) for channels-last tensors of 16-bit or float32
// elements, channels a multiple of 8, ATen's ops for every other call.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>

#include "common/packed_input.h"
#include "cutlassfuse/common/upsampled_modulation.h"
#include "dispatch/op_arguments.h"
#include "torch/upsample_nearest.h"
#include "torch/upsampled_modulation.h"

namespace cutlassfuse {
namespace {

// A packed channels-last CUDA tensor of `input`'s type and device, aligned to 16 bytes.
bool channels_last_operand(const at::Tensor& t, const at::Tensor& input) {
  return packed_5d_cuda_input(t) && t.scalar_type() == input.scalar_type() && t.device() == input.device() &&
         t.is_contiguous(at::MemoryFormat::ChannelsLast3d) && aligned_16(t);
}

// The problem where the pass takes the call (a valid one).
std::optional<UpsampledModulation> kernel_problem(const at::Tensor& input, const at::Tensor& scale,
                                                  const at::Tensor& shift, bool causal_frames, ActivationKind kind,
                                                  double parameter) {
  const std::optional<ElementType> element = element_type(input.scalar_type());
  if (!element || !channels_last_operand(input, input) || !channels_last_operand(scale, input) ||
      !channels_last_operand(shift, input))
    return std::nullopt;
  UpsampledModulation p{{input.size(0),
                         input.size(1),
                         {scale.size(2), scale.size(3), scale.size(4)},
                         {input.size(2), input.size(3), input.size(4)},
                         {}},
                        *element,
                        {kind, static_cast<float>(parameter)}};
  p.grid.causal_frames = causal_frames;
  for (int dim = 0; dim < 3; ++dim) {
    const bool later_frames = causal_frames && dim == 0;  // the later frames' scale over the later frames
    const int64_t in = p.grid.input[dim] - later_frames, out = p.grid.output[dim] - later_frames;
    p.grid.scale[dim] = in > 0 && out > 0 ? upsample_nearest_scale(0., false, in, out) : 1.f;
  }
  if (!upsampled_modulation_takes(p)) return std::nullopt;
  return p;
}

}  // namespace

at::Tensor upsampled_modulation_cuda(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                     bool causal_frames, c10::string_view activation, double activation_parameter) {
  const ActivationKind kind = check_upsampled_modulation(input, scale, shift, activation);
  const std::optional<UpsampledModulation> p =
      kernel_problem(input, scale, shift, causal_frames, kind, activation_parameter);
  if (!p) return aten_upsampled_modulation(input, scale, shift, causal_frames, activation, activation_parameter);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::Tensor out = at::empty_like(input, at::MemoryFormat::ChannelsLast3d);
  upsampled_modulation(input.const_data_ptr(), scale.const_data_ptr(), shift.const_data_ptr(), out.data_ptr(), *p,
                       at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
