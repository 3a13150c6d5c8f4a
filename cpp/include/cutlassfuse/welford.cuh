// Chan et al.'s pairwise merge of GroupNorm partial statistics, shared by the
// deconvolution's epilogue and the finalize kernel. Callers fix the order of merges,
// so results are bitwise reproducible.
#pragma once

#include "cutlassfuse/group_norm.h"

namespace cutlassfuse {

// Robust where E[x^2] - E[x]^2 cancels: only differences of means are squared.
__device__ __forceinline__ WelfordPartial merge(WelfordPartial a, WelfordPartial b) {
  const float count = a.count + b.count;
  if (count == 0.f) return a;
  const float delta = b.mean - a.mean;
  const float weight_b = b.count / count;
  return {count, a.mean + delta * weight_b, a.m2 + b.m2 + delta * delta * a.count * weight_b};
}

__device__ __forceinline__ WelfordPartial shuffle_down(WelfordPartial p, int offset) {
  return {__shfl_down_sync(0xffffffffu, p.count, offset), __shfl_down_sync(0xffffffffu, p.mean, offset),
          __shfl_down_sync(0xffffffffu, p.m2, offset)};
}

// The merge of a warp's 32 partials, in lane 0 (a fixed tree).
__device__ __forceinline__ WelfordPartial warp_merge(WelfordPartial p) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) p = merge(p, shuffle_down(p, offset));
  return p;
}

}  // namespace cutlassfuse
