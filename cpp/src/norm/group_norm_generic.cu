// GroupNorm's normalize with an activation before and after the norm, over a
// convolution output of any layout and channel count (the statistics are
// norm_statistics.cu's). See cutlassfuse/norm/group_norm_generic.h.
#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "norm/norm_activation_terms.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
// Elements a normalize block handles: kPerThread a thread, kThreads apart, read at once.
constexpr int kPerThread = 8;
constexpr int kChunk = kThreads * kPerThread;

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
                                ActivationParams after, int64_t spatial, int channels, int64_t chunks_per_plane,
                                T* out) {
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
    if (i < spatial) out_row[i] = from_float<T>(v[j]);
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
                                       float (*tile)[kTransposeTile + 1], int64_t n, int64_t pixel_begin,
                                       int channel_begin) {
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
      T* dst = out + (n * channels + channel[r]) * spatial + pixel;
      if constexpr (kVectorPixels) {
        store_vector(dst, v);
      } else {
        *dst = from_float<T>(v[r]);
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
                                        int channels, T* __restrict__ out, T* __restrict__ activation) {
  __shared__ float tile[kTransposeTile][kTransposeTile + 1];  // [channel][pixel]
  const int64_t n = blockIdx.y;
  const int64_t pixel_begin = int64_t{blockIdx.x} * kTransposeTile;
  const int channel_begin = static_cast<int>(blockIdx.z) * kTransposeTile;
  normalize_tile_keeping<T, kVectorPixels>(y, pre, scale_shift, after, spatial, channels, out, tile, n, pixel_begin,
                                           channel_begin);
  __syncthreads();
  store_tile_channels_last<T, kVectorChannels>(tile, spatial, channels, activation, n, pixel_begin, channel_begin);
}

template <class T>
void launch_normalize_keeping_channels_first(const T* y, const PreTerms<T>& pre, const float2* scale_shift,
                                             const ActivationParams& after, const GroupNormShape& shape, T* out,
                                             T* activation, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(shape.spatial, kTransposeTile)), static_cast<unsigned>(shape.batch),
                  static_cast<unsigned>(ceil_div(shape.channels, kTransposeTile)));
  const int channels = static_cast<int>(shape.channels);
  const auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, 0, stream>>>(y, pre, scale_shift, after, shape.spatial, channels, out, activation);
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
// place); activation (pre(y)), when kept, may be y too: each element is read and
// written by one thread.
template <class T>
__global__ void __launch_bounds__(kThreads)
normalize_channels_last_kernel(const T* y, PreTerms<T> pre, const float2* __restrict__ scale_shift,
                               ActivationParams after, int64_t spatial, int channels, int64_t chunks_per_sample, T* out,
                               T* activation) {
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
    if (begin + k < count) out[offset + k] = from_float<T>(v[j]);
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
  const int channels = static_cast<int>(shape.channels);
  if (layout == ActivationLayout::kChannelsLast) {
    const int64_t chunks = ceil_div(shape.spatial * shape.channels, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * chunks);
    normalize_channels_last_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(data, pre, ss, after, shape.spatial, channels, chunks, out, activation);
  } else if (activation == nullptr) {
    const int64_t chunks = ceil_div(shape.spatial, kChunk);
    const auto blocks = static_cast<unsigned>(shape.batch * shape.channels * chunks);
    normalize_channels_first_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(data, pre, ss, after, shape.spatial, channels, chunks, out);
  } else {
    launch_normalize_keeping_channels_first<T>(data, pre, ss, after, shape, out, activation, stream);
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
