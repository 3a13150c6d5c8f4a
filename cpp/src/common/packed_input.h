// What the copy kernels (common/gather_copy.cuh) read, checked on the host by the ops that
// launch them (the replicate pad, the nearest upsamplings).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace cutlassfuse {

// A 5-D CUDA tensor packed in the layout PyTorch suggests for it (NCDHW or NDHWC), aligned
// to its elements, without a lazy negation or conjugation.
inline bool packed_5d_cuda_input(const at::Tensor& input) {
  return input.is_cuda() && input.layout() == at::kStrided && input.dim() == 5 && !input.is_neg() && !input.is_conj() &&
         input.is_contiguous(input.suggest_memory_format()) &&
         reinterpret_cast<uintptr_t>(input.const_data_ptr()) % input.element_size() == 0;
}

// Whether `t`'s data starts on a 16-byte boundary (the kernels' vector accesses).
inline bool aligned_16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

}  // namespace cutlassfuse
