// GroupNorm over a post-ReLU activation stored NDHWC: deterministic partial
// statistics, then a normalize pass that merges them and writes the output in the
// caller's memory format. See cutlassfuse/group_norm.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "cutlassfuse/group_norm.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Every thread moves 16 bytes at a time: 8 channels of a 16-bit type.
constexpr int kVector = 8;
// Per-channel scale/shift and per-group statistics live in shared memory next to
// the transpose tile; 1024 channels keep the normalize kernels under 48 KB.
constexpr int64_t kMaxChannels = 1024;
// NCDHW output goes through a shared-memory transpose of kTile x kTile tiles.
constexpr int kTile = 64;
// Normalize blocks of the channels-last path handle about this many elements.
constexpr int64_t kApplyElementsPerBlock = 16384;

// --- element access ------------------------------------------------------------------

__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <class T>
__device__ __forceinline__ void load_vector(const T* src, float (&v)[kVector]) {
  static_assert(sizeof(T) * kVector == sizeof(uint4));
  uint4 raw = *reinterpret_cast<const uint4*>(src);
  const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector; ++i) v[i] = to_float(elems[i]);
}

template <class T>
__device__ __forceinline__ void store_vector(T* dst, const float (&v)[kVector]) {
  uint4 raw;
  T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVector; ++i) elems[i] = from_float<T>(v[i]);
  *reinterpret_cast<uint4*>(dst) = raw;
}

__device__ __forceinline__ float load_affine(const void* p, ElementType type, int64_t i, float absent) {
  if (p == nullptr) return absent;
  switch (type) {
    case ElementType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElementType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// --- Welford / Chan -------------------------------------------------------------------

// Chan et al.'s pairwise merge. The order of merges is fixed by the callers, so the
// result is bitwise reproducible.
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

// --- pass 1: partial statistics -------------------------------------------------------

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

// --- pass 2: normalize ------------------------------------------------------------------

// Merges sample n's partials per group (warp per group, lanes strided over chunks,
// then a fixed shuffle tree) and folds mean, rstd, gamma and beta into one
// multiply-add per element: out = x * scale[c] + shift[c].
__device__ void load_scale_shift(const WelfordPartial* __restrict__ partials, int64_t num_chunks,
                                 int64_t n, int channels, int num_groups, GroupNormAffine affine,
                                 float eps, float* scale, float* shift) {
  __shared__ float group_mean[kMaxChannels];
  __shared__ float group_rstd[kMaxChannels];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int g = warp; g < num_groups; g += kWarps) {
    WelfordPartial acc{0.f, 0.f, 0.f};
    for (int64_t chunk = lane; chunk < num_chunks; chunk += 32) {
      acc = merge(acc, partials[(n * num_chunks + chunk) * num_groups + g]);
    }
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

template <class T>
__global__ void __launch_bounds__(kThreads)
apply_channels_last_kernel(const T* __restrict__ activation, const WelfordPartial* __restrict__ partials,
                           int64_t num_chunks, int64_t spatial, int channels, int num_groups,
                           GroupNormAffine affine, float eps, int64_t rows_per_block, T* __restrict__ out) {
  __shared__ float scale[kMaxChannels];
  __shared__ float shift[kMaxChannels];
  const int64_t n = blockIdx.y;
  load_scale_shift(partials, num_chunks, n, channels, num_groups, affine, eps, scale, shift);

  const int vectors_per_row = channels / kVector;
  const int64_t row_begin = blockIdx.x * rows_per_block;
  const int64_t rows = min(spatial - row_begin, rows_per_block);
  const int64_t base = (n * spatial + row_begin) * channels;
  for (int64_t i = threadIdx.x; i < rows * vectors_per_row; i += kThreads) {
    const int64_t offset = base + (i / vectors_per_row) * channels;
    const int c0 = static_cast<int>(i % vectors_per_row) * kVector;
    float v[kVector];
    load_vector(activation + offset + c0, v);
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = fmaf(v[k], scale[c0 + k], shift[c0 + k]);
    store_vector(out + offset + c0, v);
  }
}

// Block (tile, n) normalizes kTile spatial rows, walking the channels kTile at a time:
// coalesced 16-byte loads along channels, a padded shared-memory transpose, then
// stores along the spatial dimension of the NCDHW output.
template <class T>
__global__ void __launch_bounds__(kThreads)
apply_ncdhw_kernel(const T* __restrict__ activation, const WelfordPartial* __restrict__ partials,
                   int64_t num_chunks, int64_t spatial, int channels, int num_groups,
                   GroupNormAffine affine, float eps, T* __restrict__ out) {
  __shared__ float scale[kMaxChannels];
  __shared__ float shift[kMaxChannels];
  __shared__ float tile[kTile][kTile + 1];  // [channel][row]; +1 keeps the transposed writes conflict-free
  const int64_t n = blockIdx.y;
  load_scale_shift(partials, num_chunks, n, channels, num_groups, affine, eps, scale, shift);

  constexpr int kVectorsPerTileRow = kTile / kVector;          // 8
  constexpr int kRowsPerLoad = kThreads / kVectorsPerTileRow;  // 32
  constexpr int kChannelsPerStore = kThreads / kTile;          // 4
  const int64_t row_begin = blockIdx.x * int64_t{kTile};
  const int rows = static_cast<int>(min(spatial - row_begin, int64_t{kTile}));

  for (int c_begin = 0; c_begin < channels; c_begin += kTile) {
    const int c_count = min(kTile, channels - c_begin);
    const int load_c = (threadIdx.x % kVectorsPerTileRow) * kVector;
    for (int r = threadIdx.x / kVectorsPerTileRow; r < kTile; r += kRowsPerLoad) {
      if (r < rows && load_c < c_count) {
        float v[kVector];
        load_vector(activation + (n * spatial + row_begin + r) * channels + c_begin + load_c, v);
#pragma unroll
        for (int k = 0; k < kVector; ++k) {
          const int c = c_begin + load_c + k;
          tile[load_c + k][r] = fmaf(v[k], scale[c], shift[c]);
        }
      }
    }
    __syncthreads();
    // A warp stores 32 consecutive rows of one channel: 64 contiguous bytes.
    const int store_r = threadIdx.x % kTile;
    if (store_r < rows) {
      for (int c = threadIdx.x / kTile; c < c_count; c += kChannelsPerStore) {
        out[(n * channels + c_begin + c) * spatial + row_begin + store_r] = from_float<T>(tile[c][store_r]);
      }
    }
    __syncthreads();
  }
}

void check_launch(const char* kernel) {
  cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: launching ") + kernel + " failed: " +
                             cudaGetErrorString(error));
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class T>
void launch_partial_stats(const void* activation, const GroupNormShape& shape, int64_t num_chunks,
                          WelfordPartial* partials, cudaStream_t stream) {
  const int64_t rows_per_chunk = ceil_div(shape.spatial, num_chunks);
  dim3 grid(static_cast<unsigned>(num_chunks), static_cast<unsigned>(shape.batch));
  partial_stats_kernel<T><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(activation), shape.spatial, static_cast<int>(shape.channels),
      static_cast<int>(shape.num_groups), rows_per_chunk, partials);
  check_launch("group_norm partial_stats_kernel");
}

template <class T>
void launch_apply(const void* activation, const WelfordPartial* partials, int64_t num_chunks,
                  const GroupNormShape& shape, const GroupNormAffine& affine, float eps,
                  bool channels_last_output, void* output, cudaStream_t stream) {
  const int channels = static_cast<int>(shape.channels);
  const int groups = static_cast<int>(shape.num_groups);
  const auto* in = static_cast<const T*>(activation);
  auto* out = static_cast<T*>(output);
  if (channels_last_output) {
    const int64_t rows_per_block = std::max<int64_t>(1, kApplyElementsPerBlock / shape.channels);
    dim3 grid(static_cast<unsigned>(ceil_div(shape.spatial, rows_per_block)), static_cast<unsigned>(shape.batch));
    apply_channels_last_kernel<T><<<grid, kThreads, 0, stream>>>(
        in, partials, num_chunks, shape.spatial, channels, groups, affine, eps, rows_per_block, out);
    check_launch("group_norm apply_channels_last_kernel");
  } else {
    dim3 grid(static_cast<unsigned>(ceil_div(shape.spatial, kTile)), static_cast<unsigned>(shape.batch));
    apply_ncdhw_kernel<T><<<grid, kThreads, 0, stream>>>(
        in, partials, num_chunks, shape.spatial, channels, groups, affine, eps, out);
    check_launch("group_norm apply_ncdhw_kernel");
  }
}

}  // namespace

const char* group_norm_unsupported_reason(const GroupNormShape& shape) {
  if (shape.channels % kVector != 0) return "channels not a multiple of 8 (16-byte vectors)";
  if (shape.channels > kMaxChannels) return "more than 1024 output channels";
  if (shape.batch > 65535) return "batch larger than 65535 (grid y limit)";
  if (ceil_div(shape.spatial, kTile) > (int64_t{1} << 31) - 1) return "spatial extent too large";
  return "";
}

int64_t group_norm_num_chunks(const GroupNormShape& shape, int sm_count) {
  const int64_t rows_per_pass = kThreads / (shape.channels / kVector);
  const int64_t target_blocks = 4 * int64_t{sm_count};
  const int64_t chunks = std::clamp<int64_t>(ceil_div(target_blocks, shape.batch), 1,
                                             std::max<int64_t>(1, ceil_div(shape.spatial, rows_per_pass)));
  return ceil_div(shape.spatial, ceil_div(shape.spatial, chunks));  // no empty chunk
}

void group_norm_partial_stats(ElementType element, const void* activation, const GroupNormShape& shape,
                              int64_t num_chunks, WelfordPartial* partials, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16: return launch_partial_stats<__half>(activation, shape, num_chunks, partials, stream);
    case ElementType::kBFloat16:
      return launch_partial_stats<__nv_bfloat16>(activation, shape, num_chunks, partials, stream);
    default: throw std::invalid_argument("cutlassfuse: group_norm kernels take float16 or bfloat16");
  }
}

void group_norm_apply(ElementType element, const void* activation, const WelfordPartial* partials,
                      int64_t num_chunks, const GroupNormShape& shape, const GroupNormAffine& affine,
                      float eps, bool channels_last_output, void* output, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16:
      return launch_apply<__half>(activation, partials, num_chunks, shape, affine, eps, channels_last_output,
                                  output, stream);
    case ElementType::kBFloat16:
      return launch_apply<__nv_bfloat16>(activation, partials, num_chunks, shape, affine, eps,
                                         channels_last_output, output, stream);
    default: throw std::invalid_argument("cutlassfuse: group_norm kernels take float16 or bfloat16");
  }
}

}  // namespace cutlassfuse
