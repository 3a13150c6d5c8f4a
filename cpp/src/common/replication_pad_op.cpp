// torch.ops.cutlassfuse.replication_pad3d's CUDA kernel: this project's replicate-pad
// copy (cutlassfuse/common/replication_pad.h) for packed 5-D tensors, ATen's
// replication_pad3d for every other call (which also raises PyTorch's errors on invalid
// arguments). The output has the input's suggested memory format.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>

#include "common/packed_input.h"
#include "cutlassfuse/common/replication_pad.h"
#include "torch/replication_pad.h"

namespace cutlassfuse {
namespace {

// The types ATen's CUDA kernel pads: every number type, not bool.
bool padded_type(at::ScalarType type) {
  return type != at::kBool && (at::isFloatingType(type) || at::isComplexType(type) || at::isIntegralType(type, false));
}

// The problem where the kernel takes the call: a packed 5-D CUDA tensor, in the layout
// it suggests, aligned to its elements, and six non-negative pads.
std::optional<ReplicationPad3d> kernel_problem(const at::Tensor& input, at::IntArrayRef padding) {
  if (!packed_5d_cuda_input(input) || padding.size() != 6 || !padded_type(input.scalar_type())) return std::nullopt;
  // F.pad's order: the last dimension's pads first.
  ReplicationPad3d p{input.size(0),
                     input.size(1),
                     {input.size(2), input.size(3), input.size(4)},
                     {padding[4], padding[2], padding[0]},
                     {padding[5], padding[3], padding[1]}};
  if (!replication_pad3d_takes(p, input.element_size())) return std::nullopt;
  return p;
}

}  // namespace

at::Tensor replication_pad3d_cuda(const at::Tensor& input, at::IntArrayRef padding) {
  const std::optional<ReplicationPad3d> p = kernel_problem(input, padding);
  if (!p) return aten_replication_pad3d(input, padding);
  const c10::cuda::CUDAGuard device_guard(input.device());
  const at::MemoryFormat format = input.suggest_memory_format();
  at::Tensor out = at::empty({p->batch, p->channels, p->output(0), p->output(1), p->output(2)},
                             input.options().memory_format(format));
  replication_pad3d(input.const_data_ptr(), out.data_ptr(), input.element_size(),
                    format == at::MemoryFormat::ChannelsLast3d, *p, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
