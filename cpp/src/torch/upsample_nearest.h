// torch.ops.cutlassfuse.upsample_nearest3d (upsample_nearest_registration.cpp): ATen's
// upsample_nearest3d (F.interpolate(x, ..., mode="nearest") on 5-D input), through this
// project's copy kernel on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

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

// The op's CUDA kernel (common/upsample_nearest_op.cpp).
at::Tensor upsample_nearest3d_cuda(const at::Tensor& input, at::IntArrayRef output_size, std::optional<double> scales_d,
                                   std::optional<double> scales_h, std::optional<double> scales_w);

}  // namespace cutlassfuse
