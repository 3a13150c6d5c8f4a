// The CUDA kernel of convert_memory_format: NCDHW <-> NDHWC of 5-D float16 and bfloat16
// tensors through this project's tiled transposes (common/layout.h); ATen's copy for
// every other tensor.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/op.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {
namespace {

// The transposes' domain: packed 5-D 16-bit tensors, channels % 8 == 0, at most 65535
// samples, 16-byte aligned, in the format opposite the one asked for.
bool transposes_take(const at::Tensor& self, bool channels_last) {
  const std::optional<ElementType> element = element_type(self.scalar_type());
  if (self.dim() != 5 || self.numel() == 0 || !element || *element == ElementType::kFloat32) return false;
  const bool packed_source =
      channels_last ? self.is_contiguous() : self.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  return packed_source && self.size(1) % 8 == 0 && self.size(0) <= 65535 &&
         reinterpret_cast<uintptr_t>(self.data_ptr()) % 16 == 0;
}

}  // namespace

at::Tensor convert_memory_format_cuda(const at::Tensor& self, bool channels_last) {
  if (!transposes_take(self, channels_last)) return reference_convert_memory_format(self, channels_last);
  const NvtxRange range("cutlassfuse.convert_memory_format");
  const c10::cuda::CUDAGuard device_guard(self.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = self.size(0), c = self.size(1), spatial = self.numel() / (n * c);
  const ElementType element = *element_type(self.scalar_type());
  at::Tensor out =
      at::empty_like(self, channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous);
  if (channels_last) {
    ncdhw_to_ndhwc(element, self.data_ptr(), out.data_ptr(), n, c, spatial, stream);
  } else {
    ndhwc_to_ncdhw(element, self.data_ptr(), out.data_ptr(), n, c, spatial, stream);
  }
  return out;
}

}  // namespace cutlassfuse
