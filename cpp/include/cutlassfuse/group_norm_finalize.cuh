// The GroupNorm finalize's device code: a (sample, group)'s partial statistics merged
// in a fixed order into the per-channel scale and shift of the normalize pass. Run by
// group_norm_finalize's kernel (group_norm.cu), and by the ping-pong deconvolution
// kernel after its last tile when it is launched cooperatively
// (dgrad_sm90_pingpong.cuh): one merge, so both give bitwise the same results.
#pragma once

#include "cutlassfuse/device_utils.cuh"
#include "cutlassfuse/group_norm.h"

namespace cutlassfuse {

__device__ __forceinline__ float load_affine(const void* p, ElementType type, int64_t i, float absent) {
  if (p == nullptr) return absent;
  switch (type) {
    case ElementType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElementType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// --- Welford / Chan -------------------------------------------------------------------

// Chan et al.'s pairwise merge. Callers fix the order of merges, so results are
// bitwise reproducible.
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

// --- where a (sample, group)'s partials are ----------------------------------------------

// The slots of one region that hold (sample n, group g): the tiles whose rows hold
// sample n, times the tiles whose columns hold group g. Plain data, so the finalize
// keeps one per region in shared memory, computed once per block: 64-bit divisions per
// loaded partial made that kernel instruction-bound.
struct TileRange {
  int64_t first_m;
  int64_t count;
  int first_n;
  int count_n;
};

__device__ inline TileRange tile_range(const PartialsRegion& r, int64_t n, int group, int cpg) {
  const TilePartials& t = r.tiles;
  const int64_t first_m = n * r.spatial / t.tile_m;
  const int64_t last_m = ((n + 1) * r.spatial - 1) / t.tile_m;
  const int first_n = group * cpg / t.tile_n;
  const int count_n = ((group + 1) * cpg - 1) / t.tile_n - first_n + 1;
  return {first_m, (last_m - first_m + 1) * count_n, first_n, count_n};
}

// Slot of the p-th partial of `range`, without divisions in the common cases: a group
// within one N tile, and tiles no taller than a sample (a tile then starts in sample n
// or in n - 1).
__device__ inline int64_t partial_slot(const PartialsRegion& region, const TileRange& range, int64_t p, int64_t sample,
                                       int group, int cpg) {
  const TilePartials& t = region.tiles;
  const bool one_column = range.count_n == 1;
  const int64_t tm = range.first_m + (one_column ? p : p / range.count_n);
  const int tn = range.first_n + (one_column ? 0 : static_cast<int>(p % range.count_n));
  const int64_t tile_row = tm * t.tile_m;
  int64_t segment = 0;
  if (tile_row < sample * region.spatial) segment = region.spatial >= t.tile_m ? 1 : sample - tile_row / region.spatial;
  const int local_group = group - tn * t.tile_n / cpg;
  return region.first_slot + ((tm * t.max_segments + segment) * t.tiles_n + tn) * t.max_local_groups + local_group;
}

// Moments of `pixels` copies of ReLU(bias[c]) for the group's channels: the output
// pixels no input reaches. Exact two-pass over at most 1024 channels.
__device__ inline WelfordPartial unreached_moments(const StatisticsSources& sources, ElementType element, int group,
                                                   int channels_per_group) {
  const int c_begin = group * channels_per_group;
  float sum = 0.f;
  for (int c = c_begin; c < c_begin + channels_per_group; ++c) sum += relu(load_affine(sources.bias, element, c, 0.f));
  const float mean = sum / channels_per_group;
  float squares = 0.f;
  for (int c = c_begin; c < c_begin + channels_per_group; ++c) {
    const float delta = relu(load_affine(sources.bias, element, c, 0.f)) - mean;
    squares = fmaf(delta, delta, squares);
  }
  const auto pixels = static_cast<float>(sources.unreached_pixels);
  return {pixels * channels_per_group, mean, pixels * squares};
}

// --- finalize: partials -> per-channel scale and shift -------------------------------------

// The slots of (sample n, group g) over all regions as one sequence, regions in order,
// so that a thread's loads do not wait on one another region by region.
struct GroupSlots {
  TileRange range[kMaxPartialsRegions];
  int64_t region_end[kMaxPartialsRegions];  // where region r's slots end in the sequence
  int region_count;

  __device__ int64_t total() const { return region_count > 0 ? region_end[region_count - 1] : 0; }
};

// One warp merges the partials of (sample n, group g), its lanes strided over the
// flattened slots with kLoadsInFlight loads issued before their merges, then a shuffle
// tree, then the unreached pixels: a fixed order, so results are bitwise reproducible.
// Then mean, rstd, gamma and beta fold into the normalize pass's one multiply-add per
// element, out = x * scale[n, c] + shift[n, c], for the group's channels. A warp per
// (sample, group), not a block: the ping-pong kernel has one CTA per SM to finalize
// with, and its eight consumer warps then keep eight merges in flight per SM (a
// (sample, group) has a few to a few thousand partials). `slots`: the warp's own.
__device__ inline void finalize_group(const StatisticsFinalize& f, int64_t n, int g, GroupSlots& slots) {
  constexpr int kLoadsInFlight = 4;
  const StatisticsSources& sources = f.sources;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int channels_per_group = f.channels / f.num_groups;
  const auto region_group = [&](int r) { return g + sources.regions[r].group_offset; };
  for (int r = lane; r < sources.region_count; r += 32) {
    slots.range[r] = tile_range(sources.regions[r], n, region_group(r), channels_per_group);
  }
  __syncwarp();
  if (lane == 0) {
    int64_t end = 0;
    for (int r = 0; r < sources.region_count; ++r) {
      end += slots.range[r].count;
      slots.region_end[r] = end;
    }
    slots.region_count = sources.region_count;
  }
  __syncwarp();

  WelfordPartial acc{0.f, 0.f, 0.f};
  for (int64_t first = lane; first < slots.total(); first += 32 * kLoadsInFlight) {
    WelfordPartial loaded[kLoadsInFlight];
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) {
      const int64_t p = first + 32 * i;
      loaded[i] = {0.f, 0.f, 0.f};
      if (p < slots.total()) {
        int r = 0;
        while (p >= slots.region_end[r]) ++r;
        const int64_t region_begin = r > 0 ? slots.region_end[r - 1] : 0;
        loaded[i] = f.partials[partial_slot(sources.regions[r], slots.range[r], p - region_begin, n, region_group(r),
                                            channels_per_group)];
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsInFlight; ++i) acc = merge(acc, loaded[i]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shuffle_down(acc, offset));
  float mean = 0.f, rstd = 0.f;
  if (lane == 0) {
    if (sources.unreached_pixels > 0) acc = merge(acc, unreached_moments(sources, f.element, g, channels_per_group));
    const float variance = acc.count > 0.f ? acc.m2 / acc.count : 0.f;  // biased, as GroupNorm
    mean = acc.mean;
    rstd = rsqrtf(variance + f.eps);
  }
  mean = __shfl_sync(0xffffffffu, mean, 0);
  rstd = __shfl_sync(0xffffffffu, rstd, 0);
  const GroupNormAffine& affine = f.affine;
  for (int c = g * channels_per_group + lane; c < (g + 1) * channels_per_group; c += 32) {
    const float scale = rstd * load_affine(affine.gamma, affine.element, c, 1.f);
    f.scale_shift[n * f.channels + c] = {scale, load_affine(affine.beta, affine.element, c, 0.f) - mean * scale};
  }
  __syncwarp();  // `slots` is read above: the warp's next (sample, group) may overwrite it
}

}  // namespace cutlassfuse
