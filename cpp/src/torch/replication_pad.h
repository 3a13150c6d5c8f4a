// torch.ops.cutlassfuse.replication_pad3d (replication_pad_registration.cpp): ATen's
// replication_pad3d (F.pad(x, pad, mode="replicate") with six pads), through this
// project's copy kernel on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

namespace cutlassfuse {

// ATen's replication_pad3d, its output in the input's suggested memory format: the op's
// reference and its kernel outside the copy kernel's scope.
inline at::Tensor aten_replication_pad3d(const at::Tensor& input, at::IntArrayRef padding) {
  return at::replication_pad3d(input, padding).contiguous(input.suggest_memory_format());
}

// The op's CUDA kernel (common/replication_pad_op.cpp).
at::Tensor replication_pad3d_cuda(const at::Tensor& input, at::IntArrayRef padding);

}  // namespace cutlassfuse
