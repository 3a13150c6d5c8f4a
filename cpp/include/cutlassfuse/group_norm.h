// Host interface of cutlassfuse's GroupNorm kernels over a post-ReLU activation
// stored NDHWC ([batch, spatial, channels], channels fastest):
//
//   1. group_norm_partial_stats: one Welford partial (count, mean, M2) per
//      (sample, chunk of spatial rows, group), written to fixed positions of a
//      workspace: no atomics, so results are bitwise reproducible.
//   2. group_norm_apply: merges each (sample, group)'s partials in a fixed order
//      (Chan et al.'s pairwise update, robust where E[x^2] - E[x]^2 cancels),
//      then writes (x - mean) * rstd * gamma + beta, channels-last or NCDHW.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/problem.h"

namespace cutlassfuse {

struct WelfordPartial {
  float count;
  float mean;
  float m2;  // sum of squared deviations from `mean`
};

struct GroupNormShape {
  int64_t batch;
  int64_t channels;
  int64_t spatial;  // Do * Ho * Wo
  int64_t num_groups;
};

struct GroupNormAffine {
  const void* gamma;  // [channels] or nullptr (ones)
  const void* beta;   // [channels] or nullptr (zeros)
  ElementType element;
};

// Empty when the kernels take `shape` (channels a multiple of 8, at most
// kMaxChannels, 32-bit row indexing), else why not.
const char* group_norm_unsupported_reason(const GroupNormShape& shape);

// Spatial chunks per sample: enough blocks to fill `sm_count` SMs a few times over.
int64_t group_norm_num_chunks(const GroupNormShape& shape, int sm_count);

// partials: [batch, num_chunks, num_groups]
void group_norm_partial_stats(ElementType element, const void* activation, const GroupNormShape& shape,
                              int64_t num_chunks, WelfordPartial* partials, cudaStream_t stream);

void group_norm_apply(ElementType element, const void* activation, const WelfordPartial* partials,
                      int64_t num_chunks, const GroupNormShape& shape, const GroupNormAffine& affine,
                      float eps, bool channels_last_output, void* output, cudaStream_t stream);

}  // namespace cutlassfuse
