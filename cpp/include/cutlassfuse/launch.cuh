// Programmatic dependent launch (sm_90): how every kernel of this project is launched.
//
// One call's kernels run back to back on one stream, each reading its predecessor's
// output (input transpose -> deconvolution -> finalize -> normalize). A kernel launched
// with programmatic stream serialization is scheduled while its predecessor drains, so
// its launch latency and prologue (barrier setup, TMA descriptor prefetch, loading the
// scale/shift table's address) overlap the predecessor's last wave instead of following
// it. Correctness rests on one rule every kernel here keeps: call
// wait_for_preceding_grid() before its first global memory access. The wait returns once
// the preceding grid has completed and its writes are visible; that grid waited for its
// own predecessor, so the stream's order holds exactly as with plain launches, across
// calls, CUDA graphs and the caching allocator's reuse of freed memory.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cutlassfuse/launch.h"

namespace cutlassfuse {

// Blocks until the grid this one was launched after has completed and its memory
// operations are visible. A no-op when the launch was not programmatic.
__device__ __forceinline__ void wait_for_preceding_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the stream's next kernel be scheduled before this grid completes (it still
// waits for this grid in its own wait_for_preceding_grid()).
__device__ __forceinline__ void allow_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The first statement of every kernel of this project: wait for the predecessor, then
// let the successor be scheduled.
__device__ __forceinline__ void start_after_preceding_grid() {
  wait_for_preceding_grid();
  allow_next_grid_launch();
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...), scheduled while the stream's
// previous kernel drains when programmatic_launch_enabled(). The kernel must keep the
// rule above.
template <class... Params, class... Args>
cudaError_t launch_after_predecessor(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                     cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace cutlassfuse
