// GroupNorm's statistics over a tensor y of any layout and channel count: the moments
// of pre(y) (y + bias, then the activation before the norm) in one read of y, as
// partials of tall tiles for group_norm_finalize. See cutlassfuse/norm/group_norm_generic.h.
//
// A block takes a tile of tile_m rows (n * spatial + pixel) x tile_n channels and, for
// each sample the tile holds rows of (a segment), sums x = pre(y) - shift and x^2 per
// channel, shift being the channel's value at the segment's first row: sums of
// deviations from a value of the data, whose cancellation stays bounded. The sums
// reduce across threads in a fixed order into per-channel (count, mean, M2), which
// merge into their group by Chan's pairwise formula in a fixed tree: one partial per
// (segment, group) of the tile, at its fixed slot. No atomics: bitwise repeatable.
//   channels-last: a thread reads kChannelsPerThread consecutive channels of a row (8
//     bytes of 16-bit data, 16 of float32), tile_n / kChannelsPerThread threads a row.
//     Its channels are fixed, so their bias and PReLU slope stay in registers.
//   NCDHW: a warp reads the runs of the segment's pixels of a few channels at once,
//     kVector consecutive pixels of each a lane (16 bytes of 16-bit data).
// Vectors need y 16-byte aligned and rows of whole vectors (channels-last: channels a
// multiple of kChannelsPerThread, NCDHW: spatial a multiple of kVector). Otherwise the
// same kernel reads one element at a time, masking what lies past the tile's channels
// or the segment's pixels.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_finalize.cuh"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "norm/norm_activation_terms.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Three blocks per SM keep 36 to 48 KB of loads in flight per SM (kRowLoads and the
// like), about what DRAM's latency needs at full bandwidth.
constexpr int kStatsBlocksPerSM = 3;
// Channels a thread of a channels-last tile owns: four, not kVector, keeps the sums,
// shifts and constants of its channels and the rows in flight in registers, whatever
// the activation, with several blocks resident per SM.
constexpr int kChannelsPerThread = 4;
// Tile sizes (generic_stats_tiles): tile_n a power of two from kChannelsPerThread to
// kMaxTileN; tile_m a multiple of kTileMGranule from kMinTileM to kMaxTileM.
constexpr int kMaxTileN = 64;
// Tiles are as tall as makes the grid one wave of resident blocks (kStatsBlocksPerSM per
// SM): a block's reduction and partials are paid once, while its loads stream, and no
// last, partly filled wave follows. Up to kMaxTileM rows, which keeps a thread's float32
// sums over a few hundred rows at most.
constexpr int kMaxTileM = 16384;
constexpr int kTileMGranule = 32;
// Each segment costs a block one reduction: tiles hold the rows of at most about
// kSamplesPerTile samples, down to kMinTileM rows.
constexpr int kSamplesPerTile = 4;
constexpr int kMinTileM = 32;

// Loads a thread has in flight at once, as many as kStatsBlocksPerSM blocks' registers
// hold without spills (ptxas -v), 32 to 64 bytes: channels-last rows of
// kChannelsPerThread elements; NCDHW channels read at once, a vector or kVector
// elements of each.
template <class T>
constexpr int kRowLoads = sizeof(T) == 2 ? 7 : 4;
constexpr int kVectorLoads = 2;
// NCDHW vectors: runs of 32 * kVector pixels of each channel read at once, so that a warp
// keeps kVectorLoads x kVectorRuns loads in flight however few channels its tile gives it.
template <class T>
constexpr int kVectorRuns = sizeof(T) == 2 ? 2 : 1;
template <class T>
constexpr int kElementLoads = sizeof(T) == 2 ? 2 : 1;

// What the statistics read.
template <class T>
struct StatsInput {
  const T* y;
  PreTerms<T> pre;
  int64_t spatial;
  int64_t rows;  // batch * spatial
  int channels;
  int channels_per_group;
  TilePartials tiles;
};

// The rows of one sample in a tile (a segment), and the tile's channels.
struct Segment {
  int64_t sample;
  int64_t row_begin;  // global row
  int rows;
  int col_begin;
  int cols;  // fewer than tile_n in the last tile column
};

struct StatsScratch {
  float2 warp_sums[kWarps][kMaxTileN];  // channels-last: each warp's (sum, squares) per channel
  float shift[kMaxTileN];               // channels-last
  WelfordPartial channel[kMaxTileN];    // the segment's moments per channel, then merged per group
};

// N elements as loaded, converted to float where they are used: 16-bit data waits for
// its turn in half the registers.
template <class T, int N>
struct Packed {
  static constexpr int kWords = N * static_cast<int>(sizeof(T)) / 4;
  static_assert(kWords == 2 || kWords % 4 == 0);
  uint32_t raw[kWords];

  // An aligned vector at src (8 or 16-byte accesses).
  __device__ __forceinline__ void load_vector(const T* src) {
    if constexpr (kWords == 2) {
      const uint2 word = *reinterpret_cast<const uint2*>(src);
      raw[0] = word.x, raw[1] = word.y;
    } else {
#pragma unroll
      for (int k = 0; k < kWords / 4; ++k) {
        const uint4 word = reinterpret_cast<const uint4*>(src)[k];
        raw[4 * k] = word.x, raw[4 * k + 1] = word.y, raw[4 * k + 2] = word.z, raw[4 * k + 3] = word.w;
      }
    }
  }

  // Element i from src[offset(i)] where inside(i), else zero.
  template <class Offset, class Inside>
  __device__ __forceinline__ void load_elements(const T* src, const Offset& offset, const Inside& inside) {
    T* elements = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int i = 0; i < N; ++i) elements[i] = inside(i) ? src[offset(i)] : from_float<T>(0.f);
  }

  __device__ __forceinline__ void unpack(float (&v)[N]) const {
    const T* elements = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = to_float(elements[i]);
  }
};

// Channels-last: the segment's moments per channel into scratch.channel. A thread owns
// kChannelsPerThread channels of the tile and every rows_per_step-th row from its
// first, kRows rows at once; the threads of a channel reduce by shuffles, then the
// warps through shared memory, in a fixed order.
template <class T, bool kVectors>
__device__ void channels_last_moments(const StatsInput<T>& a, const Segment& s, StatsScratch& scratch) {
  constexpr int kC = kChannelsPerThread;
  constexpr int kRows = kRowLoads<T>;
  const int threads_per_row = a.tiles.tile_n / kC;
  const int rows_per_step = kThreads / threads_per_row;
  const int first = static_cast<int>(threadIdx.x) % threads_per_row * kC;  // within the tile
  const int count = min(kC, s.cols - first);
  // One row's kC channels at src: a vector, or `count` elements.
  const auto load_row = [&](Packed<T, kC>& row, const T* src) {
    if constexpr (kVectors) {
      row.load_vector(src);
    } else {
      row.load_elements(src, [](int i) { return i; }, [&](int i) { return i < count; });
    }
  };
  float sum[kC] = {};
  float squares[kC] = {};
  float shift[kC] = {};
  if (count > 0) {
    const ChannelTerms<kC> terms(a.pre, [&](int i) { return s.col_begin + first + i; }, count);
    const auto own = [](int i) { return i; };
    const T* origin = a.y + s.row_begin * a.channels + s.col_begin + first;
    Packed<T, kC> first_row;
    load_row(first_row, origin);
    first_row.unpack(shift);
    terms.apply(shift, own);
    const int64_t step = int64_t{rows_per_step} * a.channels;
#pragma unroll 1
    for (int r = static_cast<int>(threadIdx.x) / threads_per_row; r < s.rows; r += kRows * rows_per_step) {
      const T* src = origin + int64_t{r} * a.channels;
      Packed<T, kC> rows[kRows] = {};
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        if (r + u * rows_per_step < s.rows) load_row(rows[u], src + u * step);
      }
#pragma unroll
      for (int u = 0; u < kRows; ++u) {
        const bool inside = r + u * rows_per_step < s.rows;
        float v[kC];
        rows[u].unpack(v);
        terms.apply(v, own);
#pragma unroll
        for (int i = 0; i < kC; ++i) {
          const float x = inside ? v[i] - shift[i] : 0.f;
          sum[i] += x;
          squares[i] = fmaf(x, x, squares[i]);
        }
      }
    }
  }
  for (int lanes = threads_per_row; lanes < 32; lanes *= 2) {
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], lanes);
      squares[i] += __shfl_xor_sync(0xffffffffu, squares[i], lanes);
    }
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (static_cast<int>(threadIdx.x) % 32 < threads_per_row) {
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if (i < count) {
        scratch.warp_sums[warp][first + i] = {sum[i], squares[i]};
        if (warp == 0) scratch.shift[first + i] = shift[i];
      }
    }
  }
  __syncthreads();
  const int c = static_cast<int>(threadIdx.x);
  if (c < s.cols) {
    float total = 0.f;
    float total_squares = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      total += scratch.warp_sums[w][c].x;
      total_squares += scratch.warp_sums[w][c].y;
    }
    scratch.channel[c] = shifted_moments(static_cast<float>(s.rows), scratch.shift[c], total, total_squares);
  }
}

// NCDHW: the segment's moments per channel into scratch.channel. Warp w takes the
// tile's channels w, w + kWarps, ..., kChannels at once (a lane's loads in flight, one
// per channel and run, however short the segment): each a contiguous run of the
// segment's pixels, 32 * kVector x kRuns at a time (vectors: kVector consecutive ones a
// lane; elements: 32 apart, each load coalesced), reduced by shuffles.
template <class T, bool kVectors>
__device__ void channels_first_moments(const StatsInput<T>& a, const Segment& s, StatsScratch& scratch) {
  constexpr int kChannels = kVectors ? kVectorLoads : kElementLoads<T>;
  constexpr int kRuns = kVectors ? kVectorRuns<T> : 1;
  constexpr int kRun = 32 * kVector;  // pixels of a channel a warp reads with one load
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  // Value i of a lane's load is src[offset(i)].
  const auto offset = [](int i) { return kVectors ? i : i * 32; };
  const int lane_first = kVectors ? lane * kVector : lane;
  const int64_t channel_stride = a.spatial * kWarps;
  for (int first = warp; first < s.cols; first += kWarps * kChannels) {
    // The warp's channels first + kWarps * u, u < count.
    const int count = min(kChannels, (s.cols - first + kWarps - 1) / kWarps);
    const int channel = s.col_begin + first;
    const ChannelTerms<kChannels> terms(a.pre, [&](int u) { return channel + kWarps * u; }, count);
    const T* runs = a.y + (s.sample * a.channels + channel) * a.spatial + (s.row_begin - s.sample * a.spatial);
    float shift[kChannels];
#pragma unroll
    for (int u = 0; u < kChannels; ++u) {
      float first_value[1] = {u < count ? to_float(runs[u * channel_stride]) : 0.f};
      terms.apply(first_value, [&](int) { return u; });
      shift[u] = first_value[0];
    }
    float sum[kChannels] = {};
    float squares[kChannels] = {};
#pragma unroll 1
    for (int p = 0; p < s.rows; p += kRun * kRuns) {
      // Run r's value i of a lane is inside the segment where its offset is below
      // limit(r) (a vector is in or out as a whole: the rows are whole vectors).
      const auto limit = [&](int r) { return s.rows - (p + r * kRun) - lane_first; };
      const auto inside = [&](int r, int i) { return offset(kVectors ? 0 : i) < limit(r); };
      Packed<T, kVector> loads[kRuns][kChannels] = {};
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
        const T* src = runs + p + r * kRun + lane_first;
#pragma unroll
        for (int u = 0; u < kChannels; ++u) {
          if (u >= count) continue;
          if constexpr (kVectors) {
            if (inside(r, 0)) loads[r][u].load_vector(src + u * channel_stride);
          } else {
            loads[r][u].load_elements(src + u * channel_stride, offset, [&](int i) { return inside(r, i); });
          }
        }
      }
      // Each channel's values in pixel order, as one run at a time would sum them.
#pragma unroll
      for (int r = 0; r < kRuns; ++r) {
#pragma unroll
        for (int u = 0; u < kChannels; ++u) {
          float v[kVector];
          loads[r][u].unpack(v);
          terms.apply(v, [&](int) { return u; });
#pragma unroll
          for (int i = 0; i < kVector; ++i) {
            const float x = inside(r, i) ? v[i] - shift[u] : 0.f;
            sum[u] += x;
            squares[u] = fmaf(x, x, squares[u]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kChannels; ++u) {
#pragma unroll
      for (int lanes = 16; lanes > 0; lanes /= 2) {
        sum[u] += __shfl_xor_sync(0xffffffffu, sum[u], lanes);
        squares[u] += __shfl_xor_sync(0xffffffffu, squares[u], lanes);
      }
      if (lane == 0 && u < count) {
        scratch.channel[first + kWarps * u] = shifted_moments(static_cast<float>(s.rows), shift[u], sum[u], squares[u]);
      }
    }
  }
}

// The segment's moments per channel (scratch.channel, complete) merged into their
// groups by Chan's formula in a fixed tree (channel k of a group's channels in the tile
// takes in channel k + step, step = 1, 2, 4, ...), each group's partial written to its
// slot.
__device__ void write_group_partials(const TilePartials& tiles, int channels_per_group, const Segment& s,
                                     int64_t segment, StatsScratch& scratch, WelfordPartial* __restrict__ partials) {
  const int j = static_cast<int>(threadIdx.x);
  int group = 0;
  int k = 0;      // j's place among its group's channels in the tile
  int width = 0;  // its group's channels in the tile
  if (j < s.cols) {
    const int channel = s.col_begin + j;
    group = channel / channels_per_group;
    const int begin = max(group * channels_per_group, s.col_begin);
    k = channel - begin;
    width = min((group + 1) * channels_per_group, s.col_begin + s.cols) - begin;
  }
  const int widest = min(channels_per_group, tiles.tile_n);
  for (int step = 1; step < widest; step *= 2) {
    if (k % (2 * step) == 0 && k + step < width) {
      scratch.channel[j] = merge(scratch.channel[j], scratch.channel[j + step]);
    }
    __syncthreads();
  }
  if (j < s.cols && k == 0) {
    const int local_group = group - s.col_begin / channels_per_group;
    partials[tile_partial_slot(blockIdx.x, segment, blockIdx.y, local_group, tiles.max_segments, tiles.tiles_n,
                               tiles.max_local_groups)] = scratch.channel[j];
  }
}

// Block (tile row, tile column): the tile's segments one after another. One kernel per
// layout and access (vectors or elements), each with its own register budget.
template <class T, bool kChannelsLast, bool kVectors>
__global__ void __launch_bounds__(kThreads, kStatsBlocksPerSM)
    norm_activation_stats_kernel(const __grid_constant__ StatsInput<T> a, WelfordPartial* __restrict__ partials) {
  __shared__ StatsScratch scratch;
  const TilePartials& tiles = a.tiles;
  const int64_t row_begin = int64_t{blockIdx.x} * tiles.tile_m;
  const int64_t row_end = min(a.rows, row_begin + tiles.tile_m);
  const int col_begin = static_cast<int>(blockIdx.y) * tiles.tile_n;
  const int cols = min(tiles.tile_n, a.channels - col_begin);
  const int64_t first_sample = row_begin / a.spatial;
  for (int64_t sample = first_sample; sample * a.spatial < row_end; ++sample) {
    const int64_t begin = max(row_begin, sample * a.spatial);
    const int rows = static_cast<int>(min(row_end, (sample + 1) * a.spatial) - begin);
    const Segment s{sample, begin, rows, col_begin, cols};
    if constexpr (kChannelsLast) {
      channels_last_moments<T, kVectors>(a, s, scratch);
    } else {
      channels_first_moments<T, kVectors>(a, s, scratch);
    }
    __syncthreads();
    write_group_partials(tiles, a.channels_per_group, s, sample - first_sample, scratch, partials);
    __syncthreads();  // the partials read scratch.channel before the next segment writes it
  }
}

// The channels rounded up to a power of two, kChannelsPerThread to kMaxTileN: narrow
// tensors get narrow tiles, so that no thread of a channels-last row idles.
int stats_tile_n(int64_t channels) {
  int tile_n = kChannelsPerThread;
  while (tile_n < kMaxTileN && tile_n < channels) tile_n *= 2;
  return tile_n;
}

int stats_tile_m(const GroupNormShape& shape, int tile_n, int sm_count) {
  const int64_t rows = shape.batch * shape.spatial;
  const int64_t tiles_n = ceil_div(shape.channels, int64_t{tile_n});
  const int64_t wave_tiles_m = std::max<int64_t>(int64_t{sm_count} * kStatsBlocksPerSM / tiles_n, 1);
  int64_t tile_m = ceil_div(ceil_div(rows, wave_tiles_m), int64_t{kTileMGranule}) * kTileMGranule;
  tile_m = std::min<int64_t>(tile_m, kSamplesPerTile * shape.spatial);
  return static_cast<int>(std::clamp<int64_t>(tile_m, kMinTileM, kMaxTileM));
}

template <class T>
void launch_stats(const void* y, ActivationLayout layout, const PreNorm& pre, const GroupNormShape& shape,
                  const TilePartials& tiles, WelfordPartial* partials, cudaStream_t stream) {
  const StatsInput<T> a{static_cast<const T*>(y),
                        pre_terms<T>(pre),
                        shape.spatial,
                        shape.batch * shape.spatial,
                        static_cast<int>(shape.channels),
                        static_cast<int>(shape.channels / shape.num_groups),
                        tiles};
  const dim3 grid(static_cast<unsigned>(ceil_div(a.rows, int64_t{tiles.tile_m})), static_cast<unsigned>(tiles.tiles_n));
  const auto launch = [&](auto kernel) { kernel<<<grid, kThreads, 0, stream>>>(a, partials); };
  const bool aligned = reinterpret_cast<uintptr_t>(y) % sizeof(uint4) == 0;
  if (layout == ActivationLayout::kChannelsLast) {
    const bool vectors = aligned && shape.channels % kChannelsPerThread == 0;
    vectors ? launch(norm_activation_stats_kernel<T, true, true>)
            : launch(norm_activation_stats_kernel<T, true, false>);
  } else {
    const bool vectors = aligned && shape.spatial % kVector == 0;
    vectors ? launch(norm_activation_stats_kernel<T, false, true>)
            : launch(norm_activation_stats_kernel<T, false, false>);
  }
  check_launch("norm_activation_stats_kernel");
}

}  // namespace

TilePartials generic_stats_tiles(const GroupNormShape& shape, int sm_count) {
  const int tile_n = stats_tile_n(shape.channels);
  return TilePartials::for_tiles(shape, stats_tile_m(shape, tile_n, sm_count), tile_n);
}

void norm_activation_stats(ElementType element, const void* y, ActivationLayout layout, const PreNorm& pre,
                           const GroupNormShape& shape, const TilePartials& tiles, WelfordPartial* partials,
                           cudaStream_t stream) {
  with_type(element, [&](auto t) { launch_stats<decltype(t)>(y, layout, pre, shape, tiles, partials, stream); });
}

}  // namespace cutlassfuse
