// The GroupNorm normalize streamed behind the deconvolution: run by the ping-pong
// kernel's producer warpgroup, whose warps 1-3 otherwise idle (warp 0 issues the TMA
// loads), while the consumer warpgroups compute tiles.
//
// Why: the normalize must read and write the whole activation once more. As a pass
// after the convolution it costs ~15-20 % of a kb61 call even at copy speed, while the
// convolution, bound by the tensor cores, leaves most of the DRAM bandwidth unused.
// Tiles run in sample order (PhaseTiles numbers M tiles before phases end, and a
// convolution's M runs over the samples), so samples complete one after another: each
// is finalized and normalized while later samples are still being computed, and only
// the last sample's share runs after the last tile.
//
// Protocol, through StreamedNormalize::progress (zeroed before the launch; every CTA is
// resident, the launch being cooperative, so spinning cannot starve a producer):
//   1. a consumer warpgroup, once a tile's TMA stores and partial statistics are
//      globally visible, adds 1 to tiles_stored[n] of every sample n the tile holds;
//   2. (sample n, group g) is finalized (finalize_group: the same fixed-order merge as
//      the finalize kernel, so the same bits) by the helpers of CTA (n * groups + g) mod
//      CTAs once all of the sample's tiles are stored; they then add 1 to
//      groups_finalized[n];
//   3. every CTA's helpers, once groups_finalized[n] reaches the group count, load the
//      sample's scale and shift into shared memory and normalize their share of it.
// The helpers walk the samples in order and only wait on tiles (which never wait on
// helpers) or on earlier steps of the same or earlier samples, so they cannot deadlock.
#pragma once

#include <cutlass/arch/barrier.h>

#include "cutlassfuse/group_norm_finalize.cuh"

namespace cutlassfuse {

inline constexpr int kStreamHelperWarps = 3;
inline constexpr int kStreamHelperThreads = kStreamHelperWarps * 32;

__device__ __forceinline__ int load_acquire(const int* p) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(value) : "l"(p) : "memory");
  return value;
}

__device__ __forceinline__ void wait_at_least(const int* counter, int target) {
  while (load_acquire(counter) < target) __nanosleep(200);
}

// The samples whose rows tile row `tile_m` of `region` holds.
struct SampleSpan {
  int64_t first;
  int64_t last;
};
__device__ inline SampleSpan samples_of_tile(const PartialsRegion& region, int64_t tile_m, int64_t batch) {
  const int64_t begin = tile_m * region.tiles.tile_m;
  const int64_t end = min(batch * region.spatial, begin + region.tiles.tile_m);
  return {begin / region.spatial, (end - 1) / region.spatial};
}

// How many tiles (over every region, each region one launched phase) hold rows of sample n.
__device__ inline int tiles_of_sample(const StatisticsSources& sources, int64_t n) {
  int64_t tiles = 0;
  for (int r = 0; r < sources.region_count; ++r) {
    const PartialsRegion& region = sources.regions[r];
    const int64_t first_m = n * region.spatial / region.tiles.tile_m;
    const int64_t last_m = ((n + 1) * region.spatial - 1) / region.tiles.tile_m;
    tiles += (last_m - first_m + 1) * region.tiles.tiles_n;
  }
  return static_cast<int>(tiles);
}

// Shared memory of the helper warps: the finalize's scratch and one sample's scale and
// shift (at most 1024 channels, group_norm_unsupported_reason).
struct StreamHelperStorage {
  FinalizeScratch<kStreamHelperWarps> scratch;
  float scale[1024];
  float shift[1024];
};

// 16-byte global loads that bypass L1: the activation was written by other SMs' TMA
// stores during this kernel.
template <class T>
__device__ __forceinline__ void load_vector_l2(const T* src, float (&v)[kVector]) {
  constexpr int kChunks = kVector * sizeof(T) / sizeof(uint4);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint4 raw = __ldcg(reinterpret_cast<const uint4*>(src) + c);
    const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kVector / kChunks; ++i) v[c * kVector / kChunks + i] = to_float(elems[i]);
  }
}

template <class T>
class StreamedNormalizer {
 public:
  // `helper_warp`: 0 .. kStreamHelperWarps - 1 within the CTA.
  __device__ StreamedNormalizer(const StreamedNormalize& job, StreamHelperStorage& storage, int helper_warp)
      : job_(job), f_(job.finalize), storage_(storage), helper_warp_(helper_warp),
        thread_(helper_warp * 32 + static_cast<int>(threadIdx.x % 32)),
        global_warp_(static_cast<int>(blockIdx.x) * kStreamHelperWarps + helper_warp),
        global_warps_(static_cast<int>(gridDim.x) * kStreamHelperWarps) {}

  __device__ void run() {
    for (int64_t n = 0; n < f_.batch; ++n) {
      finalize_owned_groups(n);
      wait_at_least(groups_finalized(n), f_.num_groups);
      sync();  // the previous sample's scale and shift are no longer read
      for (int c = thread_; c < f_.channels; c += kStreamHelperThreads) {
        const float2 ss = __ldcg(&f_.scale_shift[n * f_.channels + c]);
        storage_.scale[c] = ss.x;
        storage_.shift[c] = ss.y;
      }
      sync();
      if (job_.channels_last_output) {
        normalize_channels_last(n);
      } else {
        normalize_ncdhw(n);
      }
    }
  }

 private:
  // Loads in flight per lane: the helpers run in the producer warpgroup's 40 registers.
  static constexpr int kInFlight = 4;

  __device__ int* tiles_stored(int64_t n) const { return job_.progress + n; }
  __device__ int* groups_finalized(int64_t n) const { return job_.progress + f_.batch + n; }

  __device__ static void sync() {
    cutlass::arch::NamedBarrier::sync(kStreamHelperThreads, cutlass::arch::ReservedNamedBarriers::FirstUserBarrier);
  }

  __device__ void finalize_owned_groups(int64_t n) {
    const int64_t ctas = gridDim.x;
    const int64_t first_item = n * f_.num_groups;
    const int64_t offset = ((int64_t{blockIdx.x} - first_item) % ctas + ctas) % ctas;
    for (int64_t item = first_item + offset; item < first_item + f_.num_groups; item += ctas) {
      if (thread_ == 0) wait_at_least(tiles_stored(n), tiles_of_sample(f_.sources, n));
      sync();
      finalize_group(f_, n, static_cast<int>(item - first_item), helper_warp_, storage_.scratch, sync);
      __threadfence();
      sync();
      if (thread_ == 0) atomicAdd(groups_finalized(n), 1);
    }
  }

  // Channels-last: consecutive lanes take consecutive 16-byte vectors of the sample.
  __device__ void normalize_channels_last(int64_t n) const {
    const int64_t offset = n * job_.spatial * f_.channels;
    const T* in = static_cast<const T*>(job_.activation) + offset;
    T* out = static_cast<T*>(job_.output) + offset;
    const int vectors_per_row = f_.channels / kVector;
    const int vectors = static_cast<int>(job_.spatial) * vectors_per_row;  // < 2^31 on the fused path
    const int lane = static_cast<int>(threadIdx.x % 32);
    constexpr int kRun = 32 * kInFlight;
    for (int first = global_warp_ * kRun; first < vectors; first += global_warps_ * kRun) {
      float v[kInFlight][kVector];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int i = first + u * 32 + lane;
        if (i < vectors) load_vector_l2(in + int64_t{i} * kVector, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int i = first + u * 32 + lane;
        if (i >= vectors) continue;
        const int c0 = (i % vectors_per_row) * kVector;
#pragma unroll
        for (int k = 0; k < kVector; ++k) v[u][k] = fmaf(v[u][k], storage_.scale[c0 + k], storage_.shift[c0 + k]);
        store_vector(out + int64_t{i} * kVector, v[u]);
      }
    }
  }

  // NCDHW: a warp takes 32 consecutive pixels (a lane each) by kInFlight * kVector
  // channels: 16-byte loads along each pixel's channels, then one 64-byte run of
  // 32 pixels per channel stored.
  __device__ void normalize_ncdhw(int64_t n) const {
    constexpr int kChannels = kInFlight * kVector;
    const int64_t spatial = job_.spatial;
    const T* in = static_cast<const T*>(job_.activation) + n * spatial * f_.channels;
    T* out = static_cast<T*>(job_.output) + n * spatial * f_.channels;
    const int channel_blocks = ceil_div(f_.channels, kChannels);
    const int64_t chunks = ceil_div(spatial, int64_t{32}) * channel_blocks;
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int64_t chunk = global_warp_; chunk < chunks; chunk += global_warps_) {
      const int64_t pixel = chunk / channel_blocks * 32 + lane;
      const int c_begin = static_cast<int>(chunk % channel_blocks) * kChannels;
      if (pixel >= spatial) continue;
      float v[kInFlight][kVector];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (c_begin + u * kVector < f_.channels) load_vector_l2(in + pixel * f_.channels + c_begin + u * kVector, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int c0 = c_begin + u * kVector;
        if (c0 >= f_.channels) break;
#pragma unroll
        for (int k = 0; k < kVector; ++k) {
          out[(c0 + k) * spatial + pixel] =
              from_float<T>(fmaf(v[u][k], storage_.scale[c0 + k], storage_.shift[c0 + k]));
        }
      }
    }
  }

  const StreamedNormalize& job_;
  const StatisticsFinalize& f_;
  StreamHelperStorage& storage_;
  int helper_warp_;
  int thread_;
  int global_warp_;
  int global_warps_;
};

}  // namespace cutlassfuse
