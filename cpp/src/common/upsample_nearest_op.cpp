// torch.ops.cutlassfuse.upsample_nearest3d's CUDA kernel: this project's nearest-upsampling
// copy (cutlassfuse/common/upsample_nearest.h) for packed 5-D tensors of the types ATen's
// CUDA kernel upsamples, ATen's upsample_nearest3d for every other call (which also raises
// PyTorch's errors on invalid arguments). The output has the input's suggested memory
// format.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <optional>

#include "common/packed_input.h"
#include "cutlassfuse/common/upsample_nearest.h"
#include "torch/upsample_nearest.h"

namespace cutlassfuse {
namespace {

// The types ATen's CUDA kernel upsamples.
bool upsampled_type(at::ScalarType type) { return at::isFloatingType(type) || type == at::kByte; }

// Whether the kernels take `input`: a packed 5-D CUDA tensor of a type ATen's CUDA kernel
// upsamples.
bool kernel_input(const at::Tensor& input) {
  return packed_5d_cuda_input(input) && upsampled_type(input.scalar_type());
}

// The problem where the kernel takes the call: a kernel input and three output sizes.
std::optional<UpsampleNearest3d> kernel_problem(const at::Tensor& input, at::IntArrayRef output_size,
                                                std::optional<double> scales_d, std::optional<double> scales_h,
                                                std::optional<double> scales_w) {
  if (!kernel_input(input) || output_size.size() != 3) return std::nullopt;
  UpsampleNearest3d p{input.size(0),
                      input.size(1),
                      {input.size(2), input.size(3), input.size(4)},
                      {output_size[0], output_size[1], output_size[2]},
                      {}};
  const std::optional<double> scales[3] = {scales_d, scales_h, scales_w};
  for (int dim = 0; dim < 3; ++dim) {
    if (p.output[dim] < 1) return std::nullopt;
    p.scale[dim] =
        upsample_nearest_scale(scales[dim].value_or(0.), scales[dim].has_value(), p.input[dim], p.output[dim]);
  }
  if (!upsample_nearest3d_takes(p, input.element_size())) return std::nullopt;
  return p;
}

// The causal upsampling's problem: the later frames' scale over the later frames.
std::optional<UpsampleNearest3d> causal_kernel_problem(const at::Tensor& input, at::ArrayRef<double> scale_factor) {
  if (!kernel_input(input) || scale_factor.size() != 3) return std::nullopt;
  const std::array<int64_t, 3> size = causal_upsample_sizes(input, scale_factor);
  UpsampleNearest3d p{
      input.size(0), input.size(1), {input.size(2), input.size(3), input.size(4)}, {size[0], size[1], size[2]}, {}};
  p.causal_frames = true;
  p.scale[0] = p.input[0] > 1 && p.output[0] > 1
                   ? upsample_nearest_scale(scale_factor[0], true, p.input[0] - 1, p.output[0] - 1)
                   : 1.f;
  for (int dim = 1; dim < 3; ++dim) {
    if (p.output[dim] < 1) return std::nullopt;
    p.scale[dim] = upsample_nearest_scale(scale_factor[dim], true, p.input[dim], p.output[dim]);
  }
  if (!upsample_nearest3d_takes(p, input.element_size())) return std::nullopt;
  return p;
}

// The upsampling of `p` into a new tensor in the input's suggested layout.
at::Tensor upsampled(const at::Tensor& input, const UpsampleNearest3d& p) {
  const c10::cuda::CUDAGuard device_guard(input.device());
  const at::MemoryFormat format = input.suggest_memory_format();
  at::Tensor out =
      at::empty({p.batch, p.channels, p.output[0], p.output[1], p.output[2]}, input.options().memory_format(format));
  upsample_nearest3d(input.const_data_ptr(), out.data_ptr(), input.element_size(),
                     format == at::MemoryFormat::ChannelsLast3d, p, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace

at::Tensor causal_upsample_nearest3d_cuda(const at::Tensor& input, at::ArrayRef<double> scale_factor) {
  const std::optional<UpsampleNearest3d> p = causal_kernel_problem(input, scale_factor);
  return p ? upsampled(input, *p) : aten_causal_upsample_nearest3d(input, scale_factor);
}

at::Tensor upsample_nearest3d_cuda(const at::Tensor& input, at::IntArrayRef output_size, std::optional<double> scales_d,
                                   std::optional<double> scales_h, std::optional<double> scales_w) {
  const std::optional<UpsampleNearest3d> p = kernel_problem(input, output_size, scales_d, scales_h, scales_w);
  return p ? upsampled(input, *p) : aten_upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w);
}

}  // namespace cutlassfuse
