// GroupNorm over a post-ReLU activation stored NDHWC: merge of deterministic partial
// statistics and a normalize pass writing the caller's memory format; plus a
// statistics pass for activations the fused epilogue did not produce.
// See cutlassfuse/group_norm.h.
#include <algorithm>

#include "cutlassfuse/device_utils.cuh"
#include "cutlassfuse/group_norm.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Per-channel scale/shift and per-group statistics live in shared memory next to
// the transpose tile; 1024 channels keep the normalize kernels under 48 KB.
constexpr int64_t kMaxChannels = 1024;
// Normalize blocks walk their rows kTile at a time; NCDHW output goes through a
// shared-memory transpose of kTile rows x kTile channels.
constexpr int kTile = 64;

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

struct ChunkIndexer {
  int64_t num_chunks;
  int num_groups;

  struct Range {
    int64_t base;
    int64_t stride;
    int64_t count;
    __device__ int64_t slot(int64_t p) const { return base + p * stride; }
  };
  __device__ Range range(int64_t n, int g) const { return {n * num_chunks * num_groups + g, num_groups, num_chunks}; }
};

struct TileIndexer {
  TilePartials tiles;
  int64_t spatial;
  int channels_per_group;

  // The tiles whose rows hold sample n, times the tiles whose columns hold group g.
  struct Range {
    TilePartials tiles;
    int64_t first_m;
    int first_n;
    int count_n;
    int64_t count;
    int64_t sample;
    int64_t spatial;
    int group;
    int channels_per_group;
    __device__ int64_t slot(int64_t p) const {
      const int64_t tm = first_m + p / count_n;
      const int tn = first_n + static_cast<int>(p % count_n);
      const int64_t segment = sample - tm * tiles.tile_m / spatial;
      const int local_group = group - tn * tiles.tile_n / channels_per_group;
      return ((tm * tiles.max_segments + segment) * tiles.tiles_n + tn) * tiles.max_local_groups + local_group;
    }
  };
  __device__ Range range(int64_t n, int g) const {
    const int64_t first_m = n * spatial / tiles.tile_m;
    const int64_t last_m = ((n + 1) * spatial - 1) / tiles.tile_m;
    const int first_n = g * channels_per_group / tiles.tile_n;
    const int last_n = ((g + 1) * channels_per_group - 1) / tiles.tile_n;
    const int count_n = last_n - first_n + 1;
    return {tiles, first_m, first_n, count_n, (last_m - first_m + 1) * count_n, n, spatial, g, channels_per_group};
  }
};

// --- statistics pass (activations not produced by the fused epilogue) --------------------

// Block (chunk, n) reduces rows [chunk * rows_per_chunk, ...) of sample n. Thread
// (row slot, vector) walks its column of 8 channels with a per-channel Welford update;
// the block then merges row slots per channel and channels per group, in fixed order.
template <class T>
__global__ void __launch_bounds__(kThreads)
partial_stats_kernel(const T* __restrict__ activation, int64_t spatial, int channels, int num_groups,
                     int64_t rows_per_chunk, WelfordPartial* __restrict__ partials) {
  __shared__ float slot_mean[kThreads * kVector];
  __shared__ float slot_m2[kThreads * kVector];
  __shared__ float slot_count[kThreads];

  const int vectors_per_row = channels / kVector;
  const int rows_per_pass = kThreads / vectors_per_row;
  const int row_slot = threadIdx.x / vectors_per_row;
  const int vector = threadIdx.x % vectors_per_row;
  const int64_t n = blockIdx.y;
  const int64_t row_begin = blockIdx.x * rows_per_chunk;
  const int64_t row_end = min(spatial, row_begin + rows_per_chunk);

  float mean[kVector] = {};
  float m2[kVector] = {};
  float count = 0.f;
  if (row_slot < rows_per_pass) {
    const T* column = activation + n * spatial * channels + vector * kVector;
    for (int64_t row = row_begin + row_slot; row < row_end; row += rows_per_pass) {
      float v[kVector];
      load_vector(column + row * channels, v);
      count += 1.f;
      const float inv_count = 1.f / count;  // shared by the 8 channels
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        const float delta = v[i] - mean[i];
        mean[i] += delta * inv_count;
        m2[i] += delta * (v[i] - mean[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      slot_mean[threadIdx.x * kVector + i] = mean[i];
      slot_m2[threadIdx.x * kVector + i] = m2[i];
    }
    slot_count[threadIdx.x] = count;
  }
  __syncthreads();

  // Per channel: merge the row slots in order. Thread c owns column c of the slot
  // table, so the result can overwrite slot 0 in place.
  for (int c = threadIdx.x; c < channels; c += kThreads) {
    WelfordPartial acc{0.f, 0.f, 0.f};
    for (int slot = 0; slot < rows_per_pass; ++slot) {
      const int index = slot * channels + c;
      acc = merge(acc, {slot_count[index / kVector], slot_mean[index], slot_m2[index]});
    }
    slot_mean[c] = acc.mean;
    slot_m2[c] = acc.m2;
  }
  __syncthreads();

  // Per group: merge its channels in order. Every channel saw every row of the chunk.
  const int channels_per_group = channels / num_groups;
  const float rows = row_end > row_begin ? static_cast<float>(row_end - row_begin) : 0.f;
  for (int g = threadIdx.x; g < num_groups; g += kThreads) {
    WelfordPartial acc{0.f, 0.f, 0.f};
    for (int c = g * channels_per_group; c < (g + 1) * channels_per_group; ++c) {
      acc = merge(acc, {rows, slot_mean[c], slot_m2[c]});
    }
    partials[(n * gridDim.x + blockIdx.x) * num_groups + g] = acc;
  }
}

// --- normalize pass ------------------------------------------------------------------------

// Merges sample n's partials per group (warp per group, lanes strided over the
// partials, then a fixed shuffle tree) and folds mean, rstd, gamma and beta into one
// multiply-add per element: out = x * scale[c] + shift[c].
template <class Indexer>
__device__ void load_scale_shift(const WelfordPartial* __restrict__ partials, Indexer indexer, int64_t n,
                                 int channels, int num_groups, GroupNormAffine affine, float eps, float* scale,
                                 float* shift) {
  __shared__ float group_mean[kMaxChannels];
  __shared__ float group_rstd[kMaxChannels];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int g = warp; g < num_groups; g += kWarps) {
    const auto range = indexer.range(n, g);
    WelfordPartial acc{0.f, 0.f, 0.f};
    for (int64_t p = lane; p < range.count; p += 32) acc = merge(acc, partials[range.slot(p)]);
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shuffle_down(acc, offset));
    if (lane == 0) {
      const float variance = acc.count > 0.f ? acc.m2 / acc.count : 0.f;  // biased, as GroupNorm
      group_mean[g] = acc.mean;
      group_rstd[g] = rsqrtf(variance + eps);
    }
  }
  __syncthreads();
  const int channels_per_group = channels / num_groups;
  for (int c = threadIdx.x; c < channels; c += kThreads) {
    const int g = c / channels_per_group;
    const float s = group_rstd[g] * load_affine(affine.gamma, affine.element, c, 1.f);
    scale[c] = s;
    shift[c] = load_affine(affine.beta, affine.element, c, 0.f) - group_mean[g] * s;
  }
  __syncthreads();
}

// kTile rows of channels-last output, 16-byte vectors, in place allowed (each element
// is read and written by the same thread).
template <class T>
__device__ void normalize_rows_channels_last(const T* activation, T* out, int64_t row_begin, int rows, int channels,
                                             const float* scale, const float* shift) {
  const int vectors_per_row = channels / kVector;
  for (int i = threadIdx.x; i < rows * vectors_per_row; i += kThreads) {
    const int64_t offset = (row_begin + i / vectors_per_row) * channels;
    const int c0 = (i % vectors_per_row) * kVector;
    float v[kVector];
    load_vector(activation + offset + c0, v);
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = fmaf(v[k], scale[c0 + k], shift[c0 + k]);
    store_vector(out + offset + c0, v);
  }
}

// kTile rows of NCDHW output, kTile channels at a time: 16-byte loads along the
// channels, a padded shared-memory transpose, then stores along the spatial
// dimension, 16-byte vectors where the rows are aligned to them.
template <class T>
__device__ void normalize_rows_ncdhw(const T* activation, T* sample_out, int64_t row_begin, int rows, int channels,
                                     int64_t spatial, const float* scale, const float* shift,
                                     float (*tile)[kTile + 1]) {
  constexpr int kVectorsPerTileRow = kTile / kVector;  // 8
  const bool aligned = spatial % kVector == 0;
  for (int c_begin = 0; c_begin < channels; c_begin += kTile) {
    const int c_count = min(kTile, channels - c_begin);
    const int load_c = (threadIdx.x % kVectorsPerTileRow) * kVector;
    if (load_c < c_count) {
      for (int r = threadIdx.x / kVectorsPerTileRow; r < rows; r += kThreads / kVectorsPerTileRow) {
        float v[kVector];
        load_vector(activation + (row_begin + r) * channels + c_begin + load_c, v);
#pragma unroll
        for (int k = 0; k < kVector; ++k) {
          const int c = c_begin + load_c + k;
          tile[load_c + k][r] = fmaf(v[k], scale[c], shift[c]);
        }
      }
    }
    __syncthreads();
    // 8 lanes store one channel's kTile rows: 128 contiguous bytes.
    const int store_r = (threadIdx.x % kVectorsPerTileRow) * kVector;
    for (int c = threadIdx.x / kVectorsPerTileRow; c < c_count; c += kThreads / kVectorsPerTileRow) {
      T* dst = sample_out + (c_begin + c) * spatial + row_begin + store_r;
      if (aligned && store_r + kVector <= rows) {
        float v[kVector];
#pragma unroll
        for (int k = 0; k < kVector; ++k) v[k] = tile[c][store_r + k];
        store_vector(dst, v);
      } else {
        for (int k = 0; k < kVector && store_r + k < rows; ++k) dst[k] = from_float<T>(tile[c][store_r + k]);
      }
    }
    __syncthreads();
  }
}

// Block (b, n) normalizes row tiles b, b + gridDim.x, ... of sample n. A few blocks per
// sample keep the per-block merge of the partials cheap next to the data they move.
template <class T, bool kChannelsLast, class Indexer>
__global__ void __launch_bounds__(kThreads)
group_norm_apply_kernel(const T* activation, const WelfordPartial* __restrict__ partials, Indexer indexer,
                        int64_t spatial, int channels, int num_groups, GroupNormAffine affine, float eps, T* out) {
  __shared__ float scale[kMaxChannels];
  __shared__ float shift[kMaxChannels];
  const int64_t n = blockIdx.y;
  load_scale_shift(partials, indexer, n, channels, num_groups, affine, eps, scale, shift);

  const T* sample_in = activation + n * spatial * channels;
  T* sample_out = out + n * spatial * channels;
  for (int64_t row_begin = blockIdx.x * int64_t{kTile}; row_begin < spatial; row_begin += gridDim.x * int64_t{kTile}) {
    const int rows = static_cast<int>(min(spatial - row_begin, int64_t{kTile}));
    if constexpr (kChannelsLast) {
      normalize_rows_channels_last(sample_in, sample_out, row_begin, rows, channels, scale, shift);
    } else {
      __shared__ float tile[kTile][kTile + 1];  // [channel][row]; +1 keeps the transposed writes conflict-free
      normalize_rows_ncdhw(sample_in, sample_out, row_begin, rows, channels, spatial, scale, shift, tile);
    }
  }
}

template <class T>
void launch_partial_stats(const void* activation, const GroupNormShape& shape, ChunkPartials layout,
                          WelfordPartial* partials, cudaStream_t stream) {
  const int64_t rows_per_chunk = ceil_div(shape.spatial, layout.num_chunks);
  const dim3 grid(static_cast<unsigned>(layout.num_chunks), static_cast<unsigned>(shape.batch));
  partial_stats_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(activation), shape.spatial,
                                                         static_cast<int>(shape.channels),
                                                         static_cast<int>(shape.num_groups), rows_per_chunk, partials);
  check_launch("partial_stats_kernel");
}

ChunkIndexer make_indexer(ChunkPartials layout, const GroupNormShape& shape) {
  return {layout.num_chunks, static_cast<int>(shape.num_groups)};
}

TileIndexer make_indexer(TilePartials layout, const GroupNormShape& shape) {
  return {layout, shape.spatial, static_cast<int>(shape.channels / shape.num_groups)};
}

template <class T, class Partials>
void launch_apply(const void* activation, const WelfordPartial* partials, Partials layout, const GroupNormShape& shape,
                  const GroupNormAffine& affine, float eps, bool channels_last_output, void* output, int sm_count,
                  cudaStream_t stream) {
  const int64_t row_tiles = ceil_div(shape.spatial, kTile);
  const int64_t blocks_per_sample = std::clamp<int64_t>(ceil_div(4 * int64_t{sm_count}, shape.batch), 1, row_tiles);
  const dim3 grid(static_cast<unsigned>(blocks_per_sample), static_cast<unsigned>(shape.batch));
  const auto indexer = make_indexer(layout, shape);
  const auto* in = static_cast<const T*>(activation);
  auto* out = static_cast<T*>(output);
  const int channels = static_cast<int>(shape.channels);
  const int groups = static_cast<int>(shape.num_groups);
  if (channels_last_output) {
    group_norm_apply_kernel<T, true><<<grid, kThreads, 0, stream>>>(in, partials, indexer, shape.spatial, channels,
                                                                     groups, affine, eps, out);
  } else {
    group_norm_apply_kernel<T, false><<<grid, kThreads, 0, stream>>>(in, partials, indexer, shape.spatial, channels,
                                                                      groups, affine, eps, out);
  }
  check_launch("group_norm_apply_kernel");
}

}  // namespace

TilePartials TilePartials::for_tiles(const GroupNormShape& shape, int tile_m, int tile_n) {
  const int64_t channels_per_group = shape.channels / shape.num_groups;
  const int64_t max_segments = std::min<int64_t>(tile_m, (tile_m - 1) / shape.spatial + 2);
  const int64_t max_local_groups = std::min<int64_t>({tile_n, (tile_n - 1) / channels_per_group + 2, shape.num_groups});
  return {tile_m, tile_n, static_cast<int>(ceil_div(shape.channels, tile_n)), static_cast<int>(max_segments),
          static_cast<int>(max_local_groups)};
}

int64_t TilePartials::slots(const GroupNormShape& shape) const {
  return ceil_div(shape.batch * shape.spatial, tile_m) * max_segments * tiles_n * max_local_groups;
}

ChunkPartials ChunkPartials::for_device(const GroupNormShape& shape, int sm_count) {
  const int64_t rows_per_pass = kThreads / (shape.channels / kVector);
  const int64_t chunks = std::clamp<int64_t>(ceil_div(4 * int64_t{sm_count}, shape.batch), 1,
                                             std::max<int64_t>(1, ceil_div(shape.spatial, rows_per_pass)));
  return {ceil_div(shape.spatial, ceil_div(shape.spatial, chunks))};  // no empty chunk
}

int64_t ChunkPartials::slots(const GroupNormShape& shape) const { return shape.batch * num_chunks * shape.num_groups; }

const char* group_norm_unsupported_reason(const GroupNormShape& shape) {
  if (shape.channels % kVector != 0) return "channels not a multiple of 8 (16-byte vectors)";
  if (shape.channels > kMaxChannels) return "more than 1024 output channels";
  if (shape.batch > 65535) return "batch larger than 65535 (grid y limit)";
  return "";
}

void group_norm_partial_stats(ElementType element, const void* activation, const GroupNormShape& shape,
                              ChunkPartials layout, WelfordPartial* partials, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16: return launch_partial_stats<__half>(activation, shape, layout, partials, stream);
    case ElementType::kBFloat16:
      return launch_partial_stats<__nv_bfloat16>(activation, shape, layout, partials, stream);
    default: throw std::invalid_argument("cutlassfuse: group_norm kernels take float16 or bfloat16");
  }
}

template <class Partials>
void group_norm_apply(ElementType element, const void* activation, const WelfordPartial* partials, Partials layout,
                      const GroupNormShape& shape, const GroupNormAffine& affine, float eps,
                      bool channels_last_output, void* output, int sm_count, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16:
      return launch_apply<__half>(activation, partials, layout, shape, affine, eps, channels_last_output, output,
                                  sm_count, stream);
    case ElementType::kBFloat16:
      return launch_apply<__nv_bfloat16>(activation, partials, layout, shape, affine, eps, channels_last_output,
                                         output, sm_count, stream);
    default: throw std::invalid_argument("cutlassfuse: group_norm kernels take float16 or bfloat16");
  }
}

template void group_norm_apply<TilePartials>(ElementType, const void*, const WelfordPartial*, TilePartials,
                                             const GroupNormShape&, const GroupNormAffine&, float, bool, void*, int,
                                             cudaStream_t);
template void group_norm_apply<ChunkPartials>(ElementType, const void*, const WelfordPartial*, ChunkPartials,
                                              const GroupNormShape&, const GroupNormAffine&, float, bool, void*, int,
                                              cudaStream_t);

}  // namespace cutlassfuse
