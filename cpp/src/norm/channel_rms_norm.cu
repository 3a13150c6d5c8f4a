// RMS normalization over channels. See cutlassfuse/norm/channel_rms_norm.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/channel_rms_norm.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The per-pixel factor from the sum of the squares of its channels, correctly rounded.
__device__ __forceinline__ float inverse_rms(float sum_of_squares, const ChannelRMSNorm& p) {
  const float mean = __fdiv_rn(sum_of_squares, static_cast<float>(p.channels));
  return p.clamp ? __fdiv_rn(1.f, fmaxf(__fsqrt_rn(mean), p.eps)) : __frsqrt_rn(__fadd_rn(mean, p.eps));
}

// act(x * r * w[c] + b[c]): with neither weight nor bias, x * r exactly.
__device__ __forceinline__ float normalized(float x, float r, int64_t c, const ChannelRMSNorm& p) {
  const float w = p.weight != nullptr ? load_as_float(p.weight, p.affine_element, c) : 1.f;
  const float b = p.bias != nullptr ? load_as_float(p.bias, p.affine_element, c) : 0.f;
  return activate(p.activation.kind, fmaf(x * r, w, b), p.activation.parameter);
}

// Channels-last: a group of `lanes` lanes (a power of two up to 32) per pixel, lane l
// holding the pixel's 16-byte vectors l, l + lanes, ... (up to kMaxVectors) in registers;
// the group's sum by shuffles in a fixed order.
constexpr int kMaxVectors = 4;

template <class T>
__global__ void __launch_bounds__(kThreads)
channel_rms_norm_channels_last_kernel(const T* __restrict__ input, T* __restrict__ out, const ChannelRMSNorm p,
                                      int lanes, int64_t total_pixels) {
  const int lane = threadIdx.x % lanes;
  const int64_t pixel = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes;
  const bool active = pixel < total_pixels;  // every lane takes part in the shuffles
  const auto vectors = static_cast<int>(p.channels / kVector);
  const int64_t first = pixel * p.channels;
  float e[kMaxVectors][kVector];
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    const int v = lane + r * lanes;
    if (active && v < vectors) load_vector(input + first + v * kVector, e[r]);
  }
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    if (active && lane + r * lanes < vectors) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum = fmaf(e[r][i], e[r][i], sum);
    }
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!active) return;
  const float factor = inverse_rms(sum, p);
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    const int v = lane + r * lanes;
    if (v < vectors) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) e[r][i] = normalized(e[r][i], factor, v * kVector + i, p);
      store_vector(out + first + v * kVector, e[r]);
    }
  }
}

// kPixels adjacent elements of `src` as float: a 16-byte vector (two for float32), or one.
template <int kPixels, class T>
__device__ __forceinline__ void load_pixels(const T* src, float (&v)[kPixels]) {
  if constexpr (kPixels == kVector) {
    load_vector(src, v);
  } else {
    v[0] = to_float(*src);
  }
}

template <int kPixels, class T>
__device__ __forceinline__ void store_pixels(T* dst, const float (&v)[kPixels]) {
  if constexpr (kPixels == kVector) {
    store_vector(dst, v);
  } else {
    *dst = from_float<T>(v[0]);
  }
}

// Planes of channels: a block per 32 * kPixels pixels of one plane, a lane per kPixels
// adjacent pixels; warp w sums channels w, w + kWarps, ...; the warps' sums added in
// shared memory in a fixed order; the channels read again (from L1 or L2) and written.
template <class T, int kPixels>
__global__ void __launch_bounds__(kThreads)
channel_rms_norm_planes_kernel(const T* __restrict__ input, T* __restrict__ out, const ChannelRMSNorm p,
                               int64_t tiles_per_plane) {
  __shared__ float sums[kWarps][kPixels][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t plane = blockIdx.x / tiles_per_plane;
  const int64_t pixel = ((blockIdx.x % tiles_per_plane) * 32 + lane) * kPixels;
  const bool active = pixel < p.pixels;  // kPixels divides the plane's pixels
  const int64_t first = plane * p.channels * p.pixels + pixel;
  float sum[kPixels] = {};
  if (active) {
#pragma unroll 4
    for (int64_t c = warp; c < p.channels; c += kWarps) {
      float e[kPixels];
      load_pixels<kPixels>(input + first + c * p.pixels, e);
#pragma unroll
      for (int j = 0; j < kPixels; ++j) sum[j] = fmaf(e[j], e[j], sum[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < kPixels; ++j) sums[warp][j][lane] = sum[j];
  __syncthreads();
  if (!active) return;
  float factor[kPixels];
#pragma unroll
  for (int j = 0; j < kPixels; ++j) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += sums[w][j][lane];
    factor[j] = inverse_rms(total, p);
  }
#pragma unroll 4
  for (int64_t c = warp; c < p.channels; c += kWarps) {
    const int64_t i = first + c * p.pixels;
    float e[kPixels];
    load_pixels<kPixels>(input + i, e);
#pragma unroll
    for (int j = 0; j < kPixels; ++j) e[j] = normalized(e[j], factor[j], c, p);
    store_pixels<kPixels>(out + i, e);
  }
}

// The lanes per pixel of channels-last input: enough for kMaxVectors vectors a lane.
int lanes_for(int64_t vectors) {
  int lanes = 1;
  while (lanes < 32 && lanes * kMaxVectors < vectors) lanes *= 2;
  return lanes;
}

template <class T, int kPixels>
void launch_planes(const T* in, T* y, const ChannelRMSNorm& p, cudaStream_t stream) {
  const int64_t tiles_per_plane = ceil_div(p.pixels, int64_t{32 * kPixels});
  const auto blocks = static_cast<unsigned>(p.planes * tiles_per_plane);
  channel_rms_norm_planes_kernel<T, kPixels><<<blocks, kThreads, 0, stream>>>(in, y, p, tiles_per_plane);
  check_launch("channel_rms_norm_planes_kernel");
}

template <class T>
void launch(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  const T* in = static_cast<const T*>(input);
  T* y = static_cast<T*>(out);
  if (p.channels_last) {
    const int lanes = lanes_for(p.channels / kVector);
    const int64_t total_pixels = p.planes * p.pixels;
    const auto blocks = static_cast<unsigned>(ceil_div(total_pixels * lanes, int64_t{kThreads}));
    channel_rms_norm_channels_last_kernel<T><<<blocks, kThreads, 0, stream>>>(in, y, p, lanes, total_pixels);
    check_launch("channel_rms_norm_channels_last_kernel");
  } else if (p.pixels % kVector == 0 && aligned_16(input) && aligned_16(out)) {
    launch_planes<T, kVector>(in, y, p, stream);
  } else {
    launch_planes<T, 1>(in, y, p, stream);
  }
}

}  // namespace

bool channel_rms_norm_takes(const ChannelRMSNorm& p) {
  const int64_t elements = p.planes * p.channels * p.pixels;
  return elements > 0 && elements <= INT32_MAX && p.activation.kind != ActivationKind::kPReLU &&
         (!p.channels_last || (p.channels % kVector == 0 && p.channels <= 32 * kMaxVectors * kVector));
}

void channel_rms_norm(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  if (!channel_rms_norm_takes(p) || (p.channels_last && !(aligned_16(input) && aligned_16(out))))
    throw std::invalid_argument(
        "cutlassfuse: channel_rms_norm takes 1 to 2^31 - 1 elements, an activation other than PReLU, and "
        "channels-last tensors only with channels a multiple of 8 up to 1024 and pointers aligned to 16 bytes");
  switch (p.element) {
    case ElementType::kFloat16: return launch<__half>(input, out, p, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(input, out, p, stream);
    default: return launch<float>(input, out, p, stream);
  }
}

}  // namespace cutlassfuse
