// TMA reads a tensor at its own address only where that address is 16-byte aligned; a
// misaligned one makes a descriptor that faults or reads garbage, and CUTLASS's
// can_implement checks shapes only.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace cutlassfuse::sm90 {

inline bool aligned_for_tma(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

}  // namespace cutlassfuse::sm90
