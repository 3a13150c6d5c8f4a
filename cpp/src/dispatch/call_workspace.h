// A call's temporaries carved from one allocation: an allocation from the caching
// allocator costs several microseconds of host time, and calls of small layers are
// bound by the host. Reserve every region, then allocate once.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "cutlassfuse/plan/problem.h"
#include "dispatch/device_allocation.h"

namespace cutlassfuse {

class CallWorkspace {
 public:
  using Region = int64_t;  // byte offset

  Region reserve(int64_t bytes) {
    const Region region = bytes_;
    bytes_ += ceil_div(bytes, kAlignment) * kAlignment;
    return region;
  }

  // On `options`'s device, which must be the current one (device_allocation.h).
  void allocate(const at::TensorOptions& options) { buffer_ = empty_on_device({bytes_}, options.dtype(at::kByte)); }

  template <class T = void>
  T* at(Region region) const {
    return reinterpret_cast<T*>(static_cast<char*>(buffer_.data_ptr()) + region);
  }

 private:
  // TMA wants 128-byte aligned tensors; 256 keeps every region on its own cache lines.
  static constexpr int64_t kAlignment = 256;

  at::Tensor buffer_;
  int64_t bytes_ = 0;
};

}  // namespace cutlassfuse
