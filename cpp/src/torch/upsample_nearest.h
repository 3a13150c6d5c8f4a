// torch.ops.cutlassfuse.upsample_nearest3d (upsample_nearest_registration.cpp): ATen's
// upsample_nearest3d (F.interpolate(x, ..., mode="nearest") on 5-D input), through this
// project's copy kernel on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>

namespace cutlassfuse {

// ATen's upsample_nearest3d, its output in the input's suggested memory format: the op's
// reference and its kernel outside the copy kernel's scope.
inline at::Tensor aten_upsample_nearest3d(const at::Tensor& input, at::IntArrayRef output_size,
                                          std::optional<double> scales_d, std::optional<double> scales_h,
                                          std::optional<double> scales_w) {
  return at::upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w)
      .contiguous(input.suggest_memory_format());
}

// The output sizes of the causal upsampling (causal_upsample_nearest3d): frame 0 kept, the
// later frames scaled by scale_factor[0]; height and width scaled as F.interpolate scales
// them (floor of size * factor).
std::array<int64_t, 3> causal_upsample_sizes(const at::Tensor& input, at::ArrayRef<double> scale_factor);

// The causal upsampling as ATen computes it (diffusers' HunyuanVideoUpsampleCausal3D): the
// first frame upsampled in space, the frames after it in time and space, concatenated
// along time; the op's reference and its kernel outside the CUDA kernel's scope.
at::Tensor aten_causal_upsample_nearest3d(const at::Tensor& input, at::ArrayRef<double> scale_factor);

// The ops' CUDA kernels (common/upsample_nearest_op.cpp).
at::Tensor causal_upsample_nearest3d_cuda(const at::Tensor& input, at::ArrayRef<double> scale_factor);
at::Tensor upsample_nearest3d_cuda(const at::Tensor& input, at::IntArrayRef output_size, std::optional<double> scales_d,
                                   std::optional<double> scales_h, std::optional<double> scales_w);

}  // namespace cutlassfuse
