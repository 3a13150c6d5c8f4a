// The GroupNorm finalize's device code: a (sample, group)'s partial statistics merged
// in a fixed order into the per-channel scale and shift of the normalize pass. Run by
// the finishing kernel's first blocks (fused path) and group_norm_finalize's kernel
// (fallback), both in group_norm.cu: one merge, so both give bitwise the same results.
#pragma once

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse {

__device__ __forceinline__ float load_affine(const void* p, ElementType type, int64_t i, float absent) {
  return p == nullptr ? absent : load_as_float(p, type, i);
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

// (count, mean, M2) of `count` values from the sums of their deviations from `shift`
// and of the deviations' squares.
__device__ __forceinline__ WelfordPartial shifted_moments(float count, float shift, float sum, float squares) {
  const float shifted_mean = sum / count;
  return {count, shift + shifted_mean, fmaxf(squares - sum * shifted_mean, 0.f)};
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
  return region.first_slot +
         tile_partial_slot(tm, segment, tn, local_group, t.max_segments, t.tiles_n, t.max_local_groups);
}

// Moments of `pixels` copies of ReLU(bias[c]) for the group's channels: the output
// pixels no input reaches. Exact two-pass over at most 1024 channels.
template <int kCapacity>
__device__ WelfordPartial unreached_moments(const StatisticsSourcesOf<kCapacity>& sources, ElementType element,
                                            int group, int channels_per_group) {
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

// 1 / sqrt(variance + eps) of a group's merged moments, the variance biased, as GroupNorm's.
__device__ __forceinline__ float group_rstd(const WelfordPartial& total, float eps) {
  const float variance = total.count > 0.f ? total.m2 / total.count : 0.f;
  return rsqrtf(variance + eps);
}

// Channel c's (scale, shift) of the normalize's out = x * scale + shift: mean, rstd, gamma
// and beta folded.
__device__ __forceinline__ float2 channel_scale_shift(const GroupNormAffine& affine, int64_t c, float mean,
                                                      float rstd) {
  const float scale = rstd * load_affine(affine.gamma, affine.element, c, 1.f);
  return {scale, load_affine(affine.beta, affine.element, c, 0.f) - mean * scale};
}

// The slots of (sample n, group g) over all regions as one sequence, regions in order,
// so that a thread's loads do not wait on one another region by region.
template <int kCapacity>
struct GroupSlots {
  TileRange range[kCapacity];
  int64_t region_end[kCapacity];  // where region r's slots end in the sequence
  int region_count;

  __device__ int64_t total() const { return region_count > 0 ? region_end[region_count - 1] : 0; }
};

// Slots of an item's sequence merged by one warp: lane l merges slots l, l + 32, l + 64
// and l + 96 of the segment in that order (four loads in flight), then a shuffle tree.
inline constexpr int kSegmentSlots = 128;

// What the kWarps warps finalizing one (sample, group) of up to kCapacity regions share.
template <int kWarps, int kCapacity = kMaxPartialsRegions>
struct FinalizeScratch {
  GroupSlots<kCapacity> slots;
  WelfordPartial segment[kWarps];
  float mean;
  float rstd;
};

// Segment `segment` of the item whose slots `slots` describes, complete at lane 0.
template <int kCapacity>
__device__ WelfordPartial merge_segment(const StatisticsFinalizeOf<kCapacity>& f, const GroupSlots<kCapacity>& slots,
                                        int64_t segment, int64_t n, int g) {
  constexpr int kLoads = kSegmentSlots / 32;
  const auto& sources = f.sources;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int channels_per_group = f.channels / f.num_groups;
  WelfordPartial loaded[kLoads];
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    const int64_t p = segment * kSegmentSlots + lane + 32 * i;
    loaded[i] = {0.f, 0.f, 0.f};
    if (p < slots.total()) {
      int r = 0;
      while (p >= slots.region_end[r]) ++r;
      const int64_t region_begin = r > 0 ? slots.region_end[r - 1] : 0;
      const int group = g + sources.regions[r].group_offset;
      loaded[i] =
          f.partials[partial_slot(sources.regions[r], slots.range[r], p - region_begin, n, group, channels_per_group)];
    }
  }
  WelfordPartial acc = loaded[0];
#pragma unroll
  for (int i = 1; i < kLoads; ++i) acc = merge(acc, loaded[i]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shuffle_down(acc, offset));
  return acc;
}

// kWarps warps (warp: 0 .. kWarps - 1; `sync` their barrier) finalize (sample n, group
// g): the item's partials, over all regions as one sequence, merge segment by segment
// (merge_segment), the segments' results in segment order, then the unreached pixels.
// The order depends neither on kWarps nor on which warp merges what, so every kernel
// finalizing gives bitwise the same results. Mean, rstd, gamma and beta then fold into
// the normalize pass's one multiply-add per element, out = x * scale[n, c] + shift[n, c],
// for the group's channels. The scratch may be reused for the next item right away:
// each field's reads precede a barrier that its next write follows.
template <int kWarps, int kCapacity, class Sync>
__device__ void finalize_group(const StatisticsFinalizeOf<kCapacity>& f, int64_t n, int g, int warp,
                               FinalizeScratch<kWarps, kCapacity>& scratch, Sync&& sync) {
  const auto& sources = f.sources;
  GroupSlots<kCapacity>& slots = scratch.slots;
  const int thread = warp * 32 + static_cast<int>(threadIdx.x % 32);
  const int channels_per_group = f.channels / f.num_groups;
  for (int r = thread; r < sources.region_count; r += kWarps * 32) {
    slots.range[r] = tile_range(sources.regions[r], n, g + sources.regions[r].group_offset, channels_per_group);
  }
  sync();
  if (thread == 0) {
    int64_t end = 0;
    for (int r = 0; r < sources.region_count; ++r) {
      end += slots.range[r].count;
      slots.region_end[r] = end;
    }
    slots.region_count = sources.region_count;
  }
  sync();

  WelfordPartial total{0.f, 0.f, 0.f};  // thread 0's
  const int64_t segments = ceil_div(slots.total(), int64_t{kSegmentSlots});
  for (int64_t first = 0; first < segments; first += kWarps) {
    const WelfordPartial segment =
        first + warp < segments ? merge_segment(f, slots, first + warp, n, g) : WelfordPartial{0.f, 0.f, 0.f};
    if (threadIdx.x % 32 == 0) scratch.segment[warp] = segment;
    sync();
    if (thread == 0) {
      for (int w = 0; w < kWarps; ++w) total = merge(total, scratch.segment[w]);
    }
    sync();
  }
  if (thread == 0) {
    if (sources.unreached_pixels > 0)
      total = merge(total, unreached_moments(sources, f.element, g, channels_per_group));
    scratch.mean = total.mean + load_affine(f.mean_shift, f.element, g, 0.f);  // one channel per group
    scratch.rstd = group_rstd(total, f.eps);
    if (f.mean != nullptr) {
      f.mean[n * f.num_groups + g] = scratch.mean;
      f.rstd[n * f.num_groups + g] = scratch.rstd;
    }
  }
  sync();
  for (int c = g * channels_per_group + thread; c < (g + 1) * channels_per_group; c += kWarps * 32)
    f.scale_shift[n * f.channels + c] = channel_scale_shift(f.affine, c, scratch.mean, scratch.rstd);
}

// --- the finishing kernels: finalize blocks in front of the normalize blocks -------------
// A launch whose first batch x groups blocks finalize a (sample, group) each and whose
// other blocks normalize: a normalize block waits until its sample's groups are all
// counted. It waits only for blocks of lower index, which the GPU starts first (blocks
// are dispatched in index order, which CUB's single-pass scan relies on too), so the
// wait cannot hold the SMs that the blocks it waits for need.

__device__ __forceinline__ int load_acquire(const int* p) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(p) : "memory");
  return value;
}

// A finalize block: (sample n, group g) finalized, then counted for its sample in
// groups_finalized.
template <int kWarps, int kCapacity>
__device__ void finalize_and_count(const StatisticsFinalizeOf<kCapacity>& f, int64_t n, int g, int* groups_finalized,
                                   FinalizeScratch<kWarps, kCapacity>& scratch) {
  finalize_group(f, n, g, static_cast<int>(threadIdx.x / 32), scratch, [] { __syncthreads(); });
  __threadfence();  // this thread's scale and shift, before the count that publishes them
  __syncthreads();
  if (threadIdx.x == 0) atomicAdd(groups_finalized + n, 1);
}

// Until sample n's groups are all finalized: thread 0 polls, the block waits at a barrier.
// Callers then read its scale and shift through L2 (__ldcg), never through the non-coherent
// read-only path.
__device__ __forceinline__ void wait_for_sample(const int* groups_finalized, int64_t n, int num_groups) {
  if (threadIdx.x == 0) {
    while (load_acquire(groups_finalized + n) < num_groups) __nanosleep(128);
  }
  __syncthreads();
}

}  // namespace cutlassfuse
