// ReLU + GroupNorm statistics and normalize over a convolution output of any layout
// and channel count. See cutlassfuse/norm/group_norm_generic.h.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_generic.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// A statistics tile: kTileM output pixels (rows n * spatial + pixel) x kTileN channels.
constexpr int kTileM = 256;
constexpr int kTileN = 64;
// Elements a normalize block handles.
constexpr int kChunk = kThreads * 8;

template <class T>
struct Activation {
  const T* y;
  const T* bias;
  int64_t spatial;
  int channels;
  bool channels_last;

  __device__ float relu_at(int64_t index, int channel) const {
    return relu(to_float(y[index]) + (bias == nullptr ? 0.f : to_float(bias[channel])));
  }
};

// The rectangle of one (sample segment, group segment) of a tile: rows of one sample.
struct Rectangle {
  int64_t sample;
  int64_t row_begin;  // global rows
  int rows;
  int col_begin;
  int cols;
};

// Count, mean and M2 of ReLU(y + bias) over the rectangle: one pass of sums shifted by
// its first value (bounded cancellation over at most kTileM * kTileN values), the
// lanes walking the rectangle along the layout's contiguous dimension.
template <class T>
__device__ WelfordPartial warp_moments(const Activation<T>& a, const Rectangle& r, int lane) {
  const int64_t pixel_begin = r.row_begin - r.sample * a.spatial;
  auto index_of = [&](int i, int& channel) {
    if (a.channels_last) {
      channel = r.col_begin + i % r.cols;
      return (r.row_begin + i / r.cols) * a.channels + channel;
    }
    channel = r.col_begin + i / r.rows;
    return (r.sample * a.channels + channel) * a.spatial + pixel_begin + i % r.rows;
  };
  int channel;
  const int64_t first = index_of(0, channel);
  const float shift = a.relu_at(first, channel);
  float sum = 0.f;
  float squares = 0.f;
  const int area = r.rows * r.cols;
#pragma unroll 4
  for (int i = lane; i < area; i += 32) {
    const int64_t index = index_of(i, channel);
    const float x = a.relu_at(index, channel) - shift;
    sum += x;
    squares = fmaf(x, x, squares);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    squares += __shfl_xor_sync(0xffffffffu, squares, offset);
  }
  const auto count = static_cast<float>(area);
  const float shifted_mean = sum / count;
  return {count, shift + shifted_mean, fmaxf(squares - sum * shifted_mean, 0.f)};
}

// Block (tile row, tile column): a warp per (sample segment, group segment) of the
// tile, each written to its fixed slot (the layout the fused epilogue writes too).
template <class T>
__global__ void __launch_bounds__(kThreads)
relu_group_norm_stats_kernel(Activation<T> a, int64_t total_rows, int channels_per_group, TilePartials tiles,
                             WelfordPartial* __restrict__ partials) {
  const int64_t tile_m = blockIdx.x;
  const int tile_n = static_cast<int>(blockIdx.y);
  const int64_t row_begin = tile_m * kTileM;
  const int rows = static_cast<int>(std::min<int64_t>(kTileM, total_rows - row_begin));
  const int col_begin = tile_n * kTileN;
  const int cols = min(kTileN, a.channels - col_begin);
  const int64_t first_sample = row_begin / a.spatial;
  const int segments = static_cast<int>((row_begin + rows - 1) / a.spatial - first_sample + 1);
  const int first_group = col_begin / channels_per_group;
  const int local_groups = (col_begin + cols - 1) / channels_per_group - first_group + 1;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int item = warp; item < segments * local_groups; item += kWarps) {
    const int segment = item / local_groups;
    const int local_group = item % local_groups;
    const int64_t sample = first_sample + segment;
    const int64_t sample_row = sample * a.spatial;
    const int64_t r0 = std::max(sample_row, row_begin);
    const int64_t r1 = std::min(sample_row + a.spatial, row_begin + rows);
    const int c0 = std::max((first_group + local_group) * channels_per_group, col_begin);
    const int c1 = std::min((first_group + local_group + 1) * channels_per_group, col_begin + cols);
    const WelfordPartial moments = warp_moments(a, Rectangle{sample, r0, static_cast<int>(r1 - r0), c0, c1 - c0}, lane);
    if (lane == 0) {
      partials[tile_partial_slot(tile_m, segment, tile_n, local_group, tiles.max_segments, tiles.tiles_n,
                                 tiles.max_local_groups)] = moments;
    }
  }
}

// NCDHW, in place: block (plane n * channels + c, chunk of the plane), contiguous
// accesses, one scale/shift per block.
template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_first_kernel(T* y, const T* bias, const float2* __restrict__ scale_shift, int64_t spatial,
                                int channels, int64_t chunks_per_plane) {
  const int64_t plane = blockIdx.x / chunks_per_plane;
  const int64_t begin = (blockIdx.x % chunks_per_plane) * kChunk;
  const int c = static_cast<int>(plane % channels);
  const float2 ss = scale_shift[plane];
  const float b = bias == nullptr ? 0.f : to_float(bias[c]);
  T* row = y + plane * spatial;
  for (int64_t i = begin + threadIdx.x; i < std::min(spatial, begin + kChunk); i += kThreads) {
    row[i] = from_float<T>(fmaf(relu(to_float(row[i]) + b), ss.x, ss.y));
  }
}

// NCDHW, keeping the activation: block (tile of kTransposeTile pixels x kTransposeTile
// channels, sample). The output is written along the pixels as y is read; the
// activation goes through a padded shared-memory transpose and is written NDHWC along
// the channels. Accesses are 8-element vectors (16 bytes of 16-bit data) where the rows
// hold whole aligned ones (kVectorPixels: pixels per sample a multiple of 8;
// kVectorChannels: channels a multiple of 8), else one element per lane.
constexpr int kTransposeTile = 64;

template <class T, bool kVectorPixels>
__device__ void normalize_tile_keeping(const T* __restrict__ y, const T* bias, const float2* __restrict__ scale_shift,
                                       int64_t spatial, int channels, T* __restrict__ out,
                                       float (*tile)[kTransposeTile + 1], int64_t n, int64_t pixel_begin,
                                       int channel_begin) {
  constexpr int kLanesPerChannel = kVectorPixels ? kTransposeTile / kVector : kTransposeTile;
  constexpr int kWidth = kVectorPixels ? kVector : 1;
  const int first = static_cast<int>(threadIdx.x % kLanesPerChannel) * kWidth;
  const int64_t pixel = pixel_begin + first;
  if (pixel >= spatial) return;  // with vectors, spatial is a whole number of them
  for (int i = static_cast<int>(threadIdx.x / kLanesPerChannel); i < kTransposeTile; i += kThreads / kLanesPerChannel) {
    const int c = channel_begin + i;
    if (c >= channels) return;
    const int64_t index = (n * channels + c) * spatial + pixel;
    const float b = bias == nullptr ? 0.f : to_float(bias[c]);
    const float2 ss = scale_shift[n * channels + c];
    float v[kVector];
    if constexpr (kVectorPixels) {
      load_vector(y + index, v);
    } else {
      v[0] = to_float(y[index]);
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      v[k] = relu(v[k] + b);
      tile[i][first + k] = v[k];
      v[k] = fmaf(v[k], ss.x, ss.y);
    }
    if constexpr (kVectorPixels) {
      store_vector(out + index, v);
    } else {
      out[index] = from_float<T>(v[0]);
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
normalize_keeping_channels_first_kernel(const T* __restrict__ y, const T* bias, const float2* __restrict__ scale_shift,
                                        int64_t spatial, int channels, T* __restrict__ out,
                                        T* __restrict__ activation) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];  // [channel][pixel]
  const int64_t n = blockIdx.y;
  const int64_t pixel_begin = int64_t{blockIdx.x} * kTransposeTile;
  const int channel_begin = static_cast<int>(blockIdx.z) * kTransposeTile;
  normalize_tile_keeping<T, kVectorPixels>(y, bias, scale_shift, spatial, channels, out, tile, n, pixel_begin,
                                           channel_begin);
  __syncthreads();
  store_tile_channels_last<T, kVectorChannels>(tile, spatial, channels, activation, n, pixel_begin, channel_begin);
}

template <class T>
void launch_normalize_keeping_channels_first(const T* y, const T* bias, const float2* scale_shift,
                                             const GroupNormShape& shape, T* out, T* activation, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(shape.spatial, kTransposeTile)), static_cast<unsigned>(shape.batch),
                  static_cast<unsigned>(ceil_div(shape.channels, kTransposeTile)));
  const int channels = static_cast<int>(shape.channels);
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(y, bias, scale_shift, shape.spatial, channels, out, activation);
  };
  const bool vector_pixels = shape.spatial % kVector == 0;
  const bool vector_channels = shape.channels % kVector == 0;
  if (vector_pixels) {
    vector_channels ? launch(normalize_keeping_channels_first_kernel<T, true, true>)
                    : launch(normalize_keeping_channels_first_kernel<T, true, false>);
  } else {
    vector_channels ? launch(normalize_keeping_channels_first_kernel<T, false, true>)
                    : launch(normalize_keeping_channels_first_kernel<T, false, false>);
  }
}

// NDHWC: block (sample, chunk of the sample's pixels x channels). out may be y (in
// place); activation, when kept, may be y too: each element is read and written by one
// thread.
template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_last_kernel(const T* y, const T* bias, const float2* __restrict__ scale_shift, int64_t spatial,
                               int channels, int64_t chunks_per_sample, T* out, T* activation) {
  const int64_t n = blockIdx.x / chunks_per_sample;
  const int64_t begin = (blockIdx.x % chunks_per_sample) * kChunk;
  const int64_t count = spatial * channels;
  const int first_channel = static_cast<int>(begin % channels);
  const int64_t sample = n * count;
  const float2* sample_ss = scale_shift + n * channels;
  for (int k = threadIdx.x; k < kChunk && begin + k < count; k += kThreads) {
    const int c = (first_channel + k) % channels;
    const float2 ss = sample_ss[c];
    const float b = bias == nullptr ? 0.f : to_float(bias[c]);
    const int64_t index = sample + begin + k;
    const float a = relu(to_float(y[index]) + b);
    if (activation != nullptr) activation[index] = from_float<T>(a);
    out[index] = from_float<T>(fmaf(a, ss.x, ss.y));
  }
}

template <class T>
void launch_stats(const void* y, ActivationLayout layout, const void* bias, const GroupNormShape& shape,
                  WelfordPartial* partials, cudaStream_t stream) {
  const Activation<T> a{static_cast<const T*>(y), static_cast<const T*>(bias), shape.spatial,
                        static_cast<int>(shape.channels), layout == ActivationLayout::kChannelsLast};
  const TilePartials tiles = generic_stats_tiles(shape);
  const int64_t total_rows = shape.batch * shape.spatial;
  const dim3 grid(static_cast<unsigned>(ceil_div(total_rows, kTileM)), static_cast<unsigned>(tiles.tiles_n));
  relu_group_norm_stats_kernel<T><<<grid, kThreads, 0, stream>>>(
      a, total_rows, static_cast<int>(shape.channels / shape.num_groups), tiles, partials);
  check_launch("relu_group_norm_stats_kernel");
}

template <class T>
void launch_normalize(void* y, ActivationLayout layout, const void* bias, const void* scale_shift,
                      const GroupNormShape& shape, const NormalizeOutputs& outputs, cudaStream_t stream) {
  auto* data = static_cast<T*>(y);
  const auto* b = static_cast<const T*>(bias);
  const auto* ss = static_cast<const float2*>(scale_shift);
  auto* out = static_cast<T*>(outputs.out == nullptr ? y : outputs.out);
  auto* activation = static_cast<T*>(outputs.activation);
  const int channels = static_cast<int>(shape.channels);
  if (layout == ActivationLayout::kChannelsLast) {
    const int64_t chunks = ceil_div(shape.spatial * shape.channels, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * chunks);
    normalize_channels_last_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(data, b, ss, shape.spatial, channels, chunks, out, activation);
  } else if (activation == nullptr) {
    const int64_t chunks = ceil_div(shape.spatial, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * shape.channels * chunks);
    normalize_channels_first_kernel<T><<<blocks, kThreads, 0, stream>>>(data, b, ss, shape.spatial, channels, chunks);
  } else {
    launch_normalize_keeping_channels_first<T>(data, b, ss, shape, out, activation, stream);
  }
  check_launch("relu_group_norm_normalize_kernel");
}

// Calls f with the C++ element type of `element`.
template <class F>
void with_type(ElementType element, F&& f) {
  switch (element) {
    case ElementType::kFloat16: return f(__half{});
    case ElementType::kBFloat16: return f(__nv_bfloat16{});
    case ElementType::kFloat32: return f(float{});
  }
}

}  // namespace

TilePartials generic_stats_tiles(const GroupNormShape& shape) { return TilePartials::for_tiles(shape, kTileM, kTileN); }

void relu_group_norm_stats(ElementType element, const void* y, ActivationLayout layout, const void* bias,
                           const GroupNormShape& shape, WelfordPartial* partials, cudaStream_t stream) {
  with_type(element, [&](auto t) { launch_stats<decltype(t)>(y, layout, bias, shape, partials, stream); });
}

void relu_group_norm_normalize(ElementType element, void* y, ActivationLayout layout, const void* bias,
                               const void* scale_shift, const GroupNormShape& shape, const NormalizeOutputs& outputs,
                               cudaStream_t stream) {
  with_type(element,
            [&](auto t) { launch_normalize<decltype(t)>(y, layout, bias, scale_shift, shape, outputs, stream); });
}

}  // namespace cutlassfuse
