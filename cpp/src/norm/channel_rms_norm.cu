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

// Channels-last: a group of `lanes` lanes (a power of two up to 32) per pixel, each lane
// reading every lanes-th 16-byte vector of the pixel's channels; the group's sum by
// shuffles in a fixed order; the vectors read again (from L1) and written.
template <class T>
__global__ void __launch_bounds__(kThreads)
channel_rms_norm_channels_last_kernel(const T* __restrict__ input, T* __restrict__ out, const ChannelRMSNorm p,
                                      int lanes, int64_t total_pixels) {
  const int lane = threadIdx.x % lanes;
  const int64_t pixel = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes;
  const bool active = pixel < total_pixels;  // every lane takes part in the shuffles
  const auto vectors = static_cast<int>(p.channels / kVector);
  const T* x = input + pixel * p.channels;
  float sum = 0.f;
  if (active) {
    for (int v = lane; v < vectors; v += lanes) {
      float e[kVector];
      load_vector(x + v * kVector, e);
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum = fmaf(e[i], e[i], sum);
    }
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!active) return;
  const float r = inverse_rms(sum, p);
  T* y = out + pixel * p.channels;
  for (int v = lane; v < vectors; v += lanes) {
    float e[kVector];
    load_vector(x + v * kVector, e);
#pragma unroll
    for (int i = 0; i < kVector; ++i) e[i] = normalized(e[i], r, v * kVector + i, p);
    store_vector(y + v * kVector, e);
  }
}

// NCDHW: a block per 32 pixels of one sample, a lane per pixel; warp w sums channels w,
// w + kWarps, ...; the warps' sums added in shared memory in a fixed order.
template <class T>
__global__ void __launch_bounds__(kThreads)
channel_rms_norm_channels_first_kernel(const T* __restrict__ input, T* __restrict__ out, const ChannelRMSNorm p,
                                       int64_t tiles_per_sample) {
  __shared__ float sums[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t sample = blockIdx.x / tiles_per_sample;
  const int64_t pixel = (blockIdx.x % tiles_per_sample) * 32 + lane;
  const bool active = pixel < p.pixels;
  const int64_t first = sample * p.channels * p.pixels + pixel;
  float sum = 0.f;
  if (active) {
#pragma unroll 4
    for (int64_t c = warp; c < p.channels; c += kWarps) {
      const float e = to_float(input[first + c * p.pixels]);
      sum = fmaf(e, e, sum);
    }
  }
  sums[warp][lane] = sum;
  __syncthreads();
  if (!active) return;
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
  const float r = inverse_rms(total, p);
#pragma unroll 4
  for (int64_t c = warp; c < p.channels; c += kWarps) {
    const int64_t i = first + c * p.pixels;
    out[i] = from_float<T>(normalized(to_float(input[i]), r, c, p));
  }
}

// The lanes per pixel of channels-last input: one per vector, up to a warp.
int lanes_for(int64_t vectors) {
  int lanes = 1;
  while (lanes < 32 && lanes < vectors) lanes *= 2;
  return lanes;
}

template <class T>
void launch(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  const T* in = static_cast<const T*>(input);
  T* y = static_cast<T*>(out);
  if (p.channels_last) {
    const int lanes = lanes_for(p.channels / kVector);
    const int64_t total_pixels = p.batch * p.pixels;
    const auto blocks = static_cast<unsigned>(ceil_div(total_pixels * lanes, int64_t{kThreads}));
    channel_rms_norm_channels_last_kernel<T><<<blocks, kThreads, 0, stream>>>(in, y, p, lanes, total_pixels);
    check_launch("channel_rms_norm_channels_last_kernel");
  } else {
    const int64_t tiles_per_sample = ceil_div(p.pixels, int64_t{32});
    const auto blocks = static_cast<unsigned>(p.batch * tiles_per_sample);
    channel_rms_norm_channels_first_kernel<T><<<blocks, kThreads, 0, stream>>>(in, y, p, tiles_per_sample);
    check_launch("channel_rms_norm_channels_first_kernel");
  }
}

}  // namespace

bool channel_rms_norm_takes(const ChannelRMSNorm& p) {
  const int64_t elements = p.batch * p.channels * p.pixels;
  return elements > 0 && elements <= INT32_MAX && p.activation.kind != ActivationKind::kPReLU &&
         (!p.channels_last || p.channels % kVector == 0);
}

void channel_rms_norm(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  const bool aligned = (reinterpret_cast<uintptr_t>(input) | reinterpret_cast<uintptr_t>(out)) % 16 == 0;
  if (!channel_rms_norm_takes(p) || (p.channels_last && !aligned))
    throw std::invalid_argument(
        "cutlassfuse: channel_rms_norm takes 1 to 2^31 - 1 elements, an activation other than PReLU, and "
        "channels-last tensors only with channels a multiple of 8 and pointers aligned to 16 bytes");
  switch (p.element) {
    case ElementType::kFloat16: return launch<__half>(input, out, p, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(input, out, p, stream);
    default: return launch<float>(input, out, p, stream);
  }
}

}  // namespace cutlassfuse
