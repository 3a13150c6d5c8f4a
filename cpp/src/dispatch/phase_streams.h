// Side streams for a call's independent launches (sub-pixel phases: disjoint outputs,
// their own partials), so that one phase's last wave can overlap the next phase's
// first. Forked from and joined back into the caller's stream, so the op stays ordered
// on it (and capturable in a CUDA graph); the tensors the launches use outlive the
// join. One stream (the default) launches everything on the caller's. The destructor
// joins too: when a launch throws, the call's workspace goes back to the caching
// allocator as the exception unwinds, and the caller's stream must not reuse it before
// the side streams' kernels that read it have finished.
#pragma once

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>

#include <algorithm>
#include <vector>

namespace cutlassfuse {

class PhaseStreams {
 public:
  // min(streams, launches) side streams when that is more than one, else none.
  PhaseStreams(int64_t streams, size_t launches, const at::cuda::CUDAStream& caller) : caller_(caller) {
    const size_t lanes = std::min(static_cast<size_t>(std::max<int64_t>(streams, 1)), launches);
    if (lanes <= 1) return;
    at::cuda::CUDAEvent forked;
    forked.record(caller_);
    for (size_t i = 0; i < lanes; ++i) {
      side_.push_back(at::cuda::getStreamFromPool(/*isHighPriority=*/false, caller_.device_index()));
      forked.block(side_.back());
    }
  }

  PhaseStreams(const PhaseStreams&) = delete;
  PhaseStreams& operator=(const PhaseStreams&) = delete;

  ~PhaseStreams() {
    try {
      join();
    } catch (...) {  // already unwinding from a failed launch, whose error is the one to report
    }
  }

  size_t count() const { return std::max<size_t>(side_.size(), 1); }

  cudaStream_t stream_for(size_t launch) const {
    return side_.empty() ? caller_.stream() : side_[launch % side_.size()].stream();
  }

  // Idempotent: the caller's stream waits once for every side stream.
  void join() {
    for (const at::cuda::CUDAStream& side : side_) {
      at::cuda::CUDAEvent done;
      done.record(side);
      done.block(caller_);
    }
    side_.clear();
  }

 private:
  at::cuda::CUDAStream caller_;
  std::vector<at::cuda::CUDAStream> side_;
};

}  // namespace cutlassfuse
