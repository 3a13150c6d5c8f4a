// GroupNorm's normalize with an activation before and after the norm, over a
// convolution output of any layout and channel count (the statistics are
// norm_statistics.cu's). See cutlassfuse/norm/group_norm_generic.h.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "norm/channel_vector.cuh"
#include "norm/norm_activation_terms.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
// Elements a normalize block handles: kPerThread a thread, kThreads apart, read at once.
constexpr int kPerThread = 8;
constexpr int kChunk = kThreads * kPerThread;
// Blocks of the vector and transposing normalize kernels resident per SM: their launch
// bounds guarantee two.
constexpr int kResidentPerSm = 2;

// The output plus the residual's value at the output's `index` (the residual in the
// output's layout), where a residual is given: the block's sum, rounded once.
template <class T>
__device__ __forceinline__ float plus_residual(const T* __restrict__ residual, int64_t index, float v) {
  return residual == nullptr ? v : v + to_float(residual[index]);
}

// v[i] = after(v[i] * scale + shift), v[i] of channel(i) with scale_shift(i).
template <int N, class ScaleShift, class Channel>
__device__ __forceinline__ void apply_norm_after(const ActivationParams& after, float (&v)[N],
                                                 const ScaleShift& scale_shift, const Channel& channel) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float2 ss = scale_shift(i);
    v[i] = fmaf(v[i], ss.x, ss.y);
  }
  activate_each(after, v, channel);
}

// NCDHW: block (plane n * channels + c, chunk of the plane), contiguous accesses, one
// set of channel constants per block. out may be y (in place): each element is read
// and written by one thread.
template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_first_kernel(const T* y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                                ActivationParams after, int64_t spatial, int channels, int64_t chunks_per_plane, T* out,
                                const T* __restrict__ residual) {
  const int64_t plane = blockIdx.x / chunks_per_plane;
  const int64_t begin = (blockIdx.x % chunks_per_plane) * kChunk + threadIdx.x;
  const int c = static_cast<int>(plane % channels);
  const float2 ss = scale_shift[plane];
  const T* row = y + plane * spatial;
  float v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + j * kThreads;
    v[j] = i < spatial ? to_float(row[i]) : 0.f;
  }
  const auto channel = [&](int) { return c; };
  apply_pre(pre, v, channel);
  apply_norm_after(after, v, [&](int) { return ss; }, channel);
  T* out_row = out + plane * spatial;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = begin + j * kThreads;
    if (i < spatial) out_row[i] = from_float<T>(plus_residual(residual, plane * spatial + i, v[j]));
  }
}

// NCDHW in whole vectors (pixels per plane a multiple of kVector; y, out and residual
// 16-byte aligned): normalize_channels_first_kernel with 16-byte accesses, each thread
// kVectorsPerThread vectors of its plane, loaded at once. out may be y (in place).
constexpr int kVectorsPerThread = 2;
constexpr int kVectorChunk = kThreads * kVectorsPerThread * kVector;

template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_first_vectors_kernel(const T* y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                                        ActivationParams after, int64_t spatial, int channels, int64_t chunks_per_plane,
                                        T* out, const T* __restrict__ residual) {
  const int64_t plane = blockIdx.x / chunks_per_plane;
  const int64_t begin = (blockIdx.x % chunks_per_plane) * kVectorChunk + int64_t{threadIdx.x} * kVector;
  const int c = static_cast<int>(plane % channels);
  const float2 ss = scale_shift[plane];
  const int64_t plane_offset = plane * spatial;
  float v[kVectorsPerThread][kVector];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int64_t i = begin + int64_t{j} * kThreads * kVector;
    if (i < spatial) load_vector(y + plane_offset + i, v[j]);
  }
  const auto channel = [&](int) { return c; };
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int64_t i = begin + int64_t{j} * kThreads * kVector;
    if (i >= spatial) break;
    apply_pre(pre, v[j], channel);
    apply_norm_after(after, v[j], [&](int) { return ss; }, channel);
    add_residual(residual, plane_offset + i, v[j]);
    store_vector(out + plane_offset + i, v[j]);
  }
}

// NCDHW, keeping pre(y): block (tile of kTransposeTile pixels x kTransposeTile
// channels, sample). The output is written along the pixels as y is read; pre(y)
// goes through a padded shared-memory transpose and is written NDHWC along the
// channels. Accesses are 8-element vectors (16 bytes of 16-bit data) where the rows
// hold whole aligned ones (kVectorPixels: pixels per sample a multiple of 8;
// kVectorChannels: channels a multiple of 8), else one element per lane. Either way a
// thread takes kVector values at once: one vector of a row, or one pixel of kVector
// rows.
constexpr int kTransposeTile = 64;

template <class T, bool kVectorPixels>
__device__ void normalize_tile_keeping(const T* __restrict__ y, const PreTerms<T>& pre,
                                       const float2* __restrict__ scale_shift, const ActivationParams& after,
                                       int64_t spatial, int channels, T* __restrict__ out,
                                       const T* __restrict__ residual, float (*tile)[kTransposeTile + 1], int64_t n,
                                       int64_t pixel_begin, int channel_begin) {
  constexpr int kLanesPerChannel = kVectorPixels ? kTransposeTile / kVector : kTransposeTile;
  constexpr int kWidth = kVectorPixels ? kVector : 1;  // pixels of a row
  constexpr int kRows = kVector / kWidth;              // rows at once
  constexpr int kRowStep = kThreads / kLanesPerChannel;
  const int first = static_cast<int>(threadIdx.x % kLanesPerChannel) * kWidth;
  const int64_t pixel = pixel_begin + first;
  if (pixel >= spatial) return;  // with vectors, spatial is a whole number of them
  for (int i = static_cast<int>(threadIdx.x / kLanesPerChannel); i < kTransposeTile; i += kRowStep * kRows) {
    if (channel_begin + i >= channels) return;
    float v[kVector];
    int channel[kRows];
    float2 ss[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      channel[r] = min(channel_begin + i + r * kRowStep, channels - 1);  // past the channels: read, not written
      ss[r] = scale_shift[n * channels + channel[r]];
      const int64_t index = (n * channels + channel[r]) * spatial + pixel;
      if constexpr (kVectorPixels) {
        load_vector(y + index, v);
      } else {
        v[r] = to_float(y[index]);
      }
    }
    const auto channel_of = [&](int k) { return channel[k / kWidth]; };
    apply_pre(pre, v, channel_of);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (channel_begin + i + r * kRowStep >= channels) break;
#pragma unroll
      for (int k = 0; k < kWidth; ++k) tile[i + r * kRowStep][first + k] = v[r * kWidth + k];
    }
    apply_norm_after(after, v, [&](int k) { return ss[k / kWidth]; }, channel_of);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (channel_begin + i + r * kRowStep >= channels) break;
      const int64_t index = (n * channels + channel[r]) * spatial + pixel;
      if constexpr (kVectorPixels) {
        add_residual(residual, index, v);
        store_vector(out + index, v);
      } else {
        out[index] = from_float<T>(plus_residual(residual, index, v[r]));
      }
    }
  }
}

template <class T, bool kVectorChannels>
__device__ void store_tile_channels_last(const float (*tile)[kTransposeTile + 1], int64_t spatial, int channels,
                                         T* __restrict__ activation, int64_t n, int64_t pixel_begin,
                                         int channel_begin) {
  constexpr int kLanesPerPixel = kVectorChannels ? kTransposeTile / kVector : kTransposeTile;
  constexpr int kWidth = kVectorChannels ? kVector : 1;
  const int first = static_cast<int>(threadIdx.x % kLanesPerPixel) * kWidth;
  const int c = channel_begin + first;
  if (c >= channels) return;  // with vectors, channels is a whole number of them
  for (int i = static_cast<int>(threadIdx.x / kLanesPerPixel); i < kTransposeTile; i += kThreads / kLanesPerPixel) {
    const int64_t p = pixel_begin + i;
    if (p >= spatial) return;
    T* dst = activation + (n * spatial + p) * channels + c;
    if constexpr (kVectorChannels) {
      float v[kVector];
#pragma unroll
      for (int k = 0; k < kVector; ++k) v[k] = tile[first + k][i];
      store_vector(dst, v);
    } else {
      *dst = from_float<T>(tile[first][i]);
    }
  }
}

template <class T, bool kVectorPixels, bool kVectorChannels>
__global__ void __launch_bounds__(kThreads)
normalize_keeping_channels_first_kernel(const T* __restrict__ y, PreTerms<T> pre,
                                        const float2* __restrict__ scale_shift, ActivationParams after, int64_t spatial,
                                        int channels, T* __restrict__ out, T* __restrict__ activation,
                                        const T* __restrict__ residual) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];  // [channel][pixel]
  const int64_t n = blockIdx.y;
  const int64_t pixel_begin = int64_t{blockIdx.x} * kTransposeTile;
  const int channel_begin = static_cast<int>(blockIdx.z) * kTransposeTile;
  normalize_tile_keeping<T, kVectorPixels>(y, pre, scale_shift, after, spatial, channels, out, residual, tile, n,
                                           pixel_begin, channel_begin);
  __syncthreads();
  store_tile_channels_last<T, kVectorChannels>(tile, spatial, channels, activation, n, pixel_begin, channel_begin);
}

template <class T>
void launch_normalize_keeping_channels_first(const T* y, const PreTerms<T>& pre, const float2* scale_shift,
                                             const ActivationParams& after, const GroupNormShape& shape, T* out,
                                             T* activation, const T* residual, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(shape.spatial, kTransposeTile)), static_cast<unsigned>(shape.batch),
                  static_cast<unsigned>(ceil_div(shape.channels, kTransposeTile)));
  const int channels = static_cast<int>(shape.channels);
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(y, pre, scale_shift, after, shape.spatial, channels, out, activation,
                                          residual);
  };
  const bool vector_pixels = shape.spatial % kVector == 0 && aligned(out) && aligned(residual);
  const bool vector_channels = shape.channels % kVector == 0;
  if (vector_pixels) {
    vector_channels ? launch(normalize_keeping_channels_first_kernel<T, true, true>)
                    : launch(normalize_keeping_channels_first_kernel<T, true, false>);
  } else {
    vector_channels ? launch(normalize_keeping_channels_first_kernel<T, false, true>)
                    : launch(normalize_keeping_channels_first_kernel<T, false, false>);
  }
}

// NDHWC, the general path (normalize_channels_last_vectors_kernel takes rows of whole
// aligned vectors): block (sample, chunk of the sample's pixels x channels). out may be
// y (in place); activation (pre(y)), when kept, may be y too: each element is read and
// written by one thread.
template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_last_kernel(const T* y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                               ActivationParams after, int64_t spatial, int channels, int64_t chunks_per_sample, T* out,
                               T* activation, const T* __restrict__ residual) {
  const int64_t n = blockIdx.x / chunks_per_sample;
  const int64_t begin = (blockIdx.x % chunks_per_sample) * kChunk;
  const int64_t count = spatial * channels;
  const int first_channel = static_cast<int>(begin % channels);
  const T* sample_y = y + n * count + begin;
  const float2* sample_ss = scale_shift + n * channels;
  float v[kPerThread];
  int channel[kPerThread];
  channel[0] = (first_channel + static_cast<int>(threadIdx.x)) % channels;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (j > 0) {  // kThreads elements further, without dividing
      channel[j] = channel[j - 1] + kThreads % channels;
      if (channel[j] >= channels) channel[j] -= channels;
    }
    const int k = threadIdx.x + j * kThreads;
    v[j] = begin + k < count ? to_float(sample_y[k]) : 0.f;
  }
  const auto channel_of = [&](int j) { return channel[j]; };
  apply_pre(pre, v, channel_of);
  const int64_t offset = n * count + begin;
  if (activation != nullptr) {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int k = threadIdx.x + j * kThreads;
      if (begin + k < count) activation[offset + k] = from_float<T>(v[j]);
    }
  }
  apply_norm_after(after, v, [&](int j) { return sample_ss[channel[j]]; }, channel_of);
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int k = threadIdx.x + j * kThreads;
    if (begin + k < count) out[offset + k] = from_float<T>(plus_residual(residual, offset + k, v[j]));
  }
}

// NDHWC in whole vectors of kVector channels (channels % kVector == 0, 16-byte aligned
// pointers; a vector is one 16-byte access of a 16-bit type, two of float): block
// (sample, part of the sample), blockDim.x a whole number of pixel rows of
// channels / kVector vectors, so that every stride of the block's walk (blockDim.x, and
// blockDim.x x blocks_per_sample) is too: each thread stays on one vector column, its
// channels' constants read once (ChannelVector), and no index is divided per vector. A
// thread walks its vectors kUnroll at a time, the sample's parts interleaved, loading
// each vector's successor as it takes the vector up: kUnroll loads stay in flight while
// it computes. out and activation may be y: each vector is read and written by one
// thread, after the thread has read it.
template <class T>
__global__ void __launch_bounds__(kThreads, kResidentPerSm)
    normalize_channels_last_vectors_kernel(const T* y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                                           ActivationParams after, int64_t spatial, int channels, int blocks_per_sample,
                                           T* out, T* activation, const T* __restrict__ residual) {
  const int n = static_cast<int>(blockIdx.x) / blocks_per_sample;
  const int part = static_cast<int>(blockIdx.x) - n * blocks_per_sample;
  const int row_vectors = channels / kVector;
  const ChannelVector terms(pre, after, scale_shift + int64_t{n} * channels,
                            static_cast<int>(threadIdx.x) % row_vectors * kVector);
  const int64_t sample_offset = int64_t{n} * spatial * channels;
  const int64_t vectors = spatial * row_vectors;
  const int64_t stride = int64_t{blocks_per_sample} * blockDim.x;
  const int64_t step = kUnroll<T> * stride;
  const int64_t begin = int64_t{part} * blockDim.x + threadIdx.x;
  LoadedVector<T> loaded[kUnroll<T>];
#pragma unroll
  for (int u = 0; u < kUnroll<T>; ++u) {
    if (begin + u * stride < vectors) loaded[u].load(y + sample_offset + (begin + u * stride) * kVector);
  }
  for (int64_t i = begin; i < vectors; i += step) {
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
      const int64_t index = i + u * stride;
      if (index >= vectors) break;
      float v[kVector];
      loaded[u].unpack(v);
      if (index + step < vectors) loaded[u].load(y + sample_offset + (index + step) * kVector);
      const int64_t offset = sample_offset + index * kVector;
      terms.apply_pre(pre.activation, v);
      if (activation != nullptr) store_vector(activation + offset, v);
      terms.apply_norm_after(after, v);
      add_residual(residual, offset, v);
      store_vector(out + offset, v);
    }
  }
}

// NDHWC y, NCDHW out, through shared memory: block (pixel tiles, sample, channel tile
// of kTransposeTile channels). A tile is up to tile_channels = min(channels,
// kTransposeTile) rows of tile_pixels pixels, tile_pixels = kUnroll vectors a thread
// (2^kTileValuesLog2 values) / tile_channels rounded down to a power of two (few
// channels make long pixel rows rather than idle lanes), held [channel][pixel] as
// float, rows padded by one value. A block walks its sample's pixel tiles
// (grid-stride), each thread on the same channels throughout.
constexpr int log2_floor(int v) { return v > 1 ? 1 + log2_floor(v / 2) : 0; }
template <class T>
constexpr int kTileValuesLog2 = log2_floor(kThreads * kVector * kUnroll<T>);
template <class T>
constexpr int kTileValues = 1 << kTileValuesLog2<T>;

// Where a block's tiles lie in y and out.
struct TransposeTiles {
  int64_t n;
  int64_t spatial;
  int channels;
  int channel_begin;
  int rows;  // channels of the block's tiles
  int tile_channels;
  int pixels_log2;  // of tile_pixels
  int row_stride;   // in the shared tile

  __device__ TransposeTiles(int64_t spatial_, int channels_, int tile_pixels_log2)
      : n(blockIdx.y), spatial(spatial_), channels(channels_),
        channel_begin(static_cast<int>(blockIdx.z) * kTransposeTile),
        rows(min(kTransposeTile, channels_ - channel_begin)), tile_channels(min(channels_, kTransposeTile)),
        pixels_log2(tile_pixels_log2), row_stride((1 << tile_pixels_log2) + 1) {}

  __device__ int64_t count() const { return ceil_div(spatial, int64_t{1} << pixels_log2); }
  __device__ int64_t pixel_begin(int64_t t) const { return t << pixels_log2; }
  __device__ int pixels(int64_t t) const {
    return static_cast<int>(min(spatial - pixel_begin(t), int64_t{1} << pixels_log2));
  }
  template <class T>
  __device__ const T* in_y(const T* y, int64_t t) const {  // the tile's first value
    return y + (n * spatial + pixel_begin(t)) * channels + channel_begin;
  }
  template <class T>
  __device__ T* in_out(T* out, int64_t t) const {  // also the residual's, null where none is given
    return out == nullptr ? nullptr : out + (n * channels + channel_begin) * spatial + pixel_begin(t);
  }
};

// With vector channels (channels % kVector == 0, y aligned), a thread's share of a tile:
// one vector column (channels `first` on, those of a ChannelVector) of up to kUnroll
// pixels, kThreads / lanes apart (kUnroll x (kThreads / lanes) >= tile_pixels: the
// threads cover the tile), read along the channels (y's contiguous dimension).
struct VectorColumn {
  int first;
  int row;  // in the tile
  int first_pixel;
  int pixel_step;
  bool active;  // within the whole pixel rows of lanes, and the channels

  __device__ explicit VectorColumn(const TransposeTiles& g) {
    const int lanes = g.tile_channels / kVector;  // per pixel
    pixel_step = kThreads / lanes;
    first_pixel = static_cast<int>(threadIdx.x) / lanes;
    row = static_cast<int>(threadIdx.x) % lanes * kVector;
    first = g.channel_begin + row;
    active = first_pixel < pixel_step && first < g.channels;
  }

  template <class T>
  __device__ __forceinline__ void load(const T* tile_origin, int channels, int pixels,
                                       LoadedVector<T> (&loaded)[kUnroll<T>]) const {
    if (!active) return;
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
      const int p = first_pixel + u * pixel_step;
      if (p < pixels) loaded[u].load(tile_origin + int64_t{p} * channels + row);
    }
  }

  // The loaded values normalized into the tile.
  template <class T>
  __device__ __forceinline__ void normalize_into(const LoadedVector<T> (&loaded)[kUnroll<T>],
                                                 const ChannelVector& terms, const ActivationParams& pre,
                                                 const ActivationParams& after, int pixels, float* tile,
                                                 int row_stride) const {
    if (!active) return;
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u) {
      const int p = first_pixel + u * pixel_step;
      if (p >= pixels) break;
      float v[kVector];
      loaded[u].unpack(v);
      terms.apply_pre(pre, v);
      terms.apply_norm_after(after, v);
#pragma unroll
      for (int k = 0; k < kVector; ++k) tile[(row + k) * row_stride + p] = v[k];
    }
  }
};

// Without vector channels: the tile's values read one per lane in y's order, each
// normalized with its channel's constants into the tile.
template <class T>
__device__ __forceinline__ void normalize_values_into_tile(const T* __restrict__ tile_origin, const PreTerms<T>& pre,
                                                           const float2* __restrict__ sample_scale_shift,
                                                           const ActivationParams& after, const TransposeTiles& g,
                                                           int pixels, float* tile) {
  const FastDivisor by_rows(static_cast<uint32_t>(g.rows));
  const int count = pixels * g.rows;
  for (int base = static_cast<int>(threadIdx.x); base < count; base += kThreads * kVector) {
    float v[kVector];
    int channel[kVector];
    int place[kVector];  // in the tile
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      // Past the tile: its last value again, not written.
      const auto element = static_cast<uint32_t>(min(base + j * kThreads, count - 1));
      const uint32_t p = by_rows.quotient(element);
      const auto r = static_cast<int>(by_rows.remainder(element, p));
      channel[j] = g.channel_begin + r;
      place[j] = r * g.row_stride + static_cast<int>(p);
      v[j] = to_float(tile_origin[int64_t{p} * g.channels + r]);
    }
    const auto channel_of = [&](int j) { return channel[j]; };
    apply_pre(pre, v, channel_of);
    apply_norm_after(after, v, [&](int j) { return sample_scale_shift[channel[j]]; }, channel_of);
#pragma unroll
    for (int j = 0; j < kVector; ++j) {
      if (base + j * kThreads < count) tile[place[j]] = v[j];
    }
  }
}

// The tile written along the pixels (out's contiguous dimension). With vector pixels
// (spatial % kVector == 0, out aligned): four lanes per 32 pixels of a row, a warp
// across eight rows (one bank per lane with the padded rows); otherwise one value per
// lane, a warp along 32 pixels of a row.
template <class T, bool kVectorPixels>
__device__ __forceinline__ void store_tile_channels_first(const float* tile, const TransposeTiles& g, int pixels,
                                                          T* __restrict__ out_origin,
                                                          const T* __restrict__ residual_origin) {
  if constexpr (kVectorPixels) {
    const int segments_log2 = g.pixels_log2 - 5;  // of 32 pixels, per row
    const int count = (g.rows + 7) / 8 * 8 << (g.pixels_log2 - 3);
#pragma unroll 1  // one vector at a time: the channels' constants and loads in flight keep their registers
    for (int e = static_cast<int>(threadIdx.x); e < count; e += kThreads) {
      const int row = ((e >> (5 + segments_log2)) << 3) + ((e >> 2) & 7);
      const int p = ((e >> 5) & ((1 << segments_log2) - 1)) * 32 + (e & 3) * kVector;
      if (row >= g.rows || p >= pixels) continue;
      float v[kVector];
#pragma unroll
      for (int k = 0; k < kVector; ++k) v[k] = tile[row * g.row_stride + p + k];
      add_residual(residual_origin, row * g.spatial + p, v);
      store_vector(out_origin + row * g.spatial + p, v);
    }
  } else {
    const int count = g.rows << g.pixels_log2;
    for (int e = static_cast<int>(threadIdx.x); e < count; e += kThreads) {
      const int row = e >> g.pixels_log2;
      const int p = e & ((1 << g.pixels_log2) - 1);
      if (p < pixels) {
        const int64_t index = int64_t{row} * g.spatial + p;
        out_origin[index] = from_float<T>(plus_residual(residual_origin, index, tile[row * g.row_stride + p]));
      }
    }
  }
}

// With vector channels, a thread loads its share of the next tile before the block
// stores the current one, so that the loads are in flight through the store.
template <class T, bool kVectorChannels, bool kVectorPixels>
__global__ void __launch_bounds__(kThreads, kResidentPerSm)
    normalize_to_channels_first_kernel(const T* __restrict__ y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                                       ActivationParams after, int64_t spatial, int channels, int tile_pixels_log2,
                                       T* __restrict__ out, const T* __restrict__ residual) {
  __shared__ float tile[kTileValues<T> + kTransposeTile];  // rows of 2^k values, 64 at most, each padded by one
  const TransposeTiles g(spatial, channels, tile_pixels_log2);
  const float2* sample_scale_shift = scale_shift + g.n * channels;
  const int64_t tiles = g.count();
  if constexpr (kVectorChannels) {
    const VectorColumn column(g);
    // Past the last channel: the last vector's constants, not used.
    const ChannelVector terms(pre, after, sample_scale_shift, min(column.first, channels - kVector));
    LoadedVector<T> loaded[kUnroll<T>];
    if (blockIdx.x < tiles) column.load(g.in_y(y, blockIdx.x), channels, g.pixels(blockIdx.x), loaded);
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      column.normalize_into(loaded, terms, pre.activation, after, g.pixels(t), tile, g.row_stride);
      __syncthreads();
      const int64_t next = t + gridDim.x;
      if (next < tiles) column.load(g.in_y(y, next), channels, g.pixels(next), loaded);
      store_tile_channels_first<T, kVectorPixels>(tile, g, g.pixels(t), g.in_out(out, t), g.in_out(residual, t));
      __syncthreads();
    }
  } else {
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      normalize_values_into_tile(g.in_y(y, t), pre, sample_scale_shift, after, g, g.pixels(t), tile);
      __syncthreads();
      store_tile_channels_first<T, kVectorPixels>(tile, g, g.pixels(t), g.in_out(out, t), g.in_out(residual, t));
      __syncthreads();
    }
  }
}

// How many blocks of the vector and transposing normalize kernels the current GPU holds
// at once. The SM count is read once per device: a driver query per call would show in
// the host time of small calls.
int64_t resident_blocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sm_counts[kMaxDevices];
  int device = 0;
  check_cuda(cudaGetDevice(&device), "querying the current device");
  int sms = device < kMaxDevices ? sm_counts[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "querying the SM count");
    if (device < kMaxDevices) sm_counts[device].store(sms, std::memory_order_relaxed);
  }
  return int64_t{sms} * kResidentPerSm;
}

// Whether a thread can take y's channels-last rows a vector of channels at a time, the
// channels' constants in its registers (ChannelVector): rows of whole vectors, y aligned.
bool takes_channel_vectors(const GroupNormShape& shape, const ActivationParams& pre, const ActivationParams& after,
                           const void* y) {
  return shape.channels % kVector == 0 && aligned(y) && ChannelVector::holds(pre, after);
}

// Whether normalize_channels_last_vectors_kernel takes the call: vector channels, at most
// a block's threads of vectors a row, the outputs aligned too.
bool channels_last_vectors(const GroupNormShape& shape, const ActivationParams& pre, const ActivationParams& after,
                           const void* y, const void* out, const void* activation, const void* residual) {
  return takes_channel_vectors(shape, pre, after, y) && shape.channels / kVector <= kThreads && aligned(out) &&
         aligned(activation) && aligned(residual);
}

template <class T>
void launch_normalize_channels_last_vectors(const T* y, const PreTerms<T>& pre, const float2* scale_shift,
                                            const ActivationParams& after, const GroupNormShape& shape, T* out,
                                            T* activation, const T* residual, cudaStream_t stream) {
  const int channels = static_cast<int>(shape.channels);
  const int row_vectors = channels / kVector;
  const int threads = kThreads / row_vectors * row_vectors;
  const auto kernel = normalize_channels_last_vectors_kernel<T>;
  // Parts per sample: as many as the GPU holds with every block of the launch resident,
  // none without a vector.
  const int64_t parts = std::min(ceil_div(shape.spatial * row_vectors, int64_t{threads} * kUnroll<T>),
                                 std::max<int64_t>(1, resident_blocks() / shape.batch));
  kernel<<<static_cast<unsigned>(shape.batch * parts), threads, 0, stream>>>(
      y, pre, scale_shift, after, shape.spatial, channels, static_cast<int>(parts), out, activation, residual);
}

template <class T>
void launch_normalize_to_channels_first(const T* y, const PreTerms<T>& pre, const float2* scale_shift,
                                        const ActivationParams& after, const GroupNormShape& shape, T* out,
                                        const T* residual, cudaStream_t stream) {
  const int channels = static_cast<int>(shape.channels);
  int channels_log2 = 0;  // of min(channels, kTransposeTile), rounded up
  while ((1 << channels_log2) < std::min(channels, kTransposeTile)) ++channels_log2;
  const int tile_pixels_log2 = kTileValuesLog2<T> - channels_log2;
  const int64_t channel_tiles = ceil_div(shape.channels, kTransposeTile);
  const int64_t pixel_tiles = ceil_div(shape.spatial, int64_t{1} << tile_pixels_log2);
  const auto launch = [&](auto kernel) {
    // Blocks per (sample, channel tile): as many as the GPU holds with every block resident.
    const int64_t walkers =
        std::min(pixel_tiles, std::max<int64_t>(1, resident_blocks() / (shape.batch * channel_tiles)));
    const dim3 grid(static_cast<unsigned>(walkers), static_cast<unsigned>(shape.batch),
                    static_cast<unsigned>(channel_tiles));
    kernel<<<grid, kThreads, 0, stream>>>(y, pre, scale_shift, after, shape.spatial, channels, tile_pixels_log2, out,
                                          residual);
  };
  const bool vector_pixels = shape.spatial % kVector == 0 && aligned(out) && aligned(residual);
  if (takes_channel_vectors(shape, pre.activation, after, y)) {
    vector_pixels ? launch(normalize_to_channels_first_kernel<T, true, true>)
                  : launch(normalize_to_channels_first_kernel<T, true, false>);
  } else {
    vector_pixels ? launch(normalize_to_channels_first_kernel<T, false, true>)
                  : launch(normalize_to_channels_first_kernel<T, false, false>);
  }
}

template <class T>
void launch_normalize(void* y, ActivationLayout layout, const PreNorm& pre_norm, const void* scale_shift,
                      const ActivationParams& after, const GroupNormShape& shape, const NormalizeOutputs& outputs,
                      cudaStream_t stream) {
  auto* data = static_cast<T*>(y);
  const PreTerms<T> pre = pre_terms<T>(pre_norm);
  const auto* ss = static_cast<const float2*>(scale_shift);
  auto* out = static_cast<T*>(outputs.out == nullptr ? y : outputs.out);
  auto* activation = static_cast<T*>(outputs.activation);
  const auto* residual = static_cast<const T*>(outputs.residual);
  const int channels = static_cast<int>(shape.channels);
  if (layout == ActivationLayout::kChannelsLast && outputs.out_channels_first) {
    if (outputs.out == nullptr || activation != nullptr)
      throw std::invalid_argument(
          "cutlassfuse: norm_activation_normalize writes NCDHW from an NDHWC y only into a separate out, keeping no "
          "activation");
    launch_normalize_to_channels_first<T>(data, pre, ss, after, shape, out, residual, stream);
  } else if (layout == ActivationLayout::kChannelsLast &&
             channels_last_vectors(shape, pre.activation, after, data, out, activation, residual)) {
    launch_normalize_channels_last_vectors<T>(data, pre, ss, after, shape, out, activation, residual, stream);
  } else if (layout == ActivationLayout::kChannelsLast) {
    const int64_t chunks = ceil_div(shape.spatial * shape.channels, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * chunks);
    normalize_channels_last_kernel<T><<<blocks, kThreads, 0, stream>>>(data, pre, ss, after, shape.spatial, channels,
                                                                       chunks, out, activation, residual);
  } else if (activation == nullptr && shape.spatial % kVector == 0 && aligned(data) && aligned(out) &&
             aligned(residual)) {
    const int64_t chunks = ceil_div(shape.spatial, int64_t{kVectorChunk});
    const auto blocks = static_cast<unsigned>(shape.batch * shape.channels * chunks);
    normalize_channels_first_vectors_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(data, pre, ss, after, shape.spatial, channels, chunks, out, residual);
  } else if (activation == nullptr) {
    const int64_t chunks = ceil_div(shape.spatial, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * shape.channels * chunks);
    normalize_channels_first_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(data, pre, ss, after, shape.spatial, channels, chunks, out, residual);
  } else {
    launch_normalize_keeping_channels_first<T>(data, pre, ss, after, shape, out, activation, residual, stream);
  }
  check_launch("norm_activation_normalize_kernel");
}

}  // namespace

void norm_activation_normalize(ElementType element, void* y, ActivationLayout layout, const PreNorm& pre,
                               const void* scale_shift, const ActivationParams& after, const GroupNormShape& shape,
                               const NormalizeOutputs& outputs, cudaStream_t stream) {
  with_type(element,
            [&](auto t) { launch_normalize<decltype(t)>(y, layout, pre, scale_shift, after, shape, outputs, stream); });
}

}  // namespace cutlassfuse
