// The fused path's finishing kernel for NCDHW output on sm90, moving its bytes with
// bulk tensor copies (group_norm_finish.cu). The fused path takes it where
// group_norm_finish_bulk_takes() says so; same results, bit for bit, as the register
// path, group_norm_finish() (norm/group_norm.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse {

// A block holds its activation chunks and a strip of all channels in shared memory
// (~71 KB at 256 channels in 64-pixel strips); wider layers keep the register path.
inline constexpr int64_t kMaxBulkChannels = 256;

// 16-bit activations whose channels are whole 64-channel boxes (128-byte swizzle
// rows), channel planes of whole 16-byte units (a tensor map's strides), both buffers
// 16-byte aligned.
bool group_norm_finish_bulk_takes(ElementType element, int64_t channels, int64_t spatial, const void* activation,
                                  const void* output);

// group_norm_finish for an NDHWC activation and NCDHW output.
void group_norm_finish_bulk(const StatisticsFinalize& finalize, int* groups_finalized, const void* activation,
                            int64_t spatial, void* output, cudaStream_t stream);

}  // namespace cutlassfuse
