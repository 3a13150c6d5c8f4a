// RMS normalization over channels. See cutlassfuse/norm/channel_rms_norm.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/channel_rms_norm.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Channels-last: up to this many 16-byte vectors of a pixel's channels a lane.
constexpr int kMaxVectors = 4;
// Planes of channels: two adjacent pixels a lane from this many pixels (the launch then
// still has over a thousand blocks, a wave; each block's channels still fit L1 for their
// second read), else one.
constexpr int64_t kPairedPixelsFrom = int64_t{1} << 16;

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T>
constexpr ElementType element_of() {
  if constexpr (std::is_same_v<T, __half>) return ElementType::kFloat16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return ElementType::kBFloat16;
  return ElementType::kFloat32;
}

// The per-pixel factor from the sum of the squares of its channels, correctly rounded.
__device__ __forceinline__ float inverse_rms(float sum_of_squares, const ChannelRMSNorm& p) {
  const float mean = __fdiv_rn(sum_of_squares, static_cast<float>(p.channels));
  return p.clamp ? __fdiv_rn(1.f, fmaxf(__fsqrt_rn(mean), p.eps)) : __frsqrt_rn(__fadd_rn(mean, p.eps));
}

// v[i] = act(v[i] * factor[i] * w[i] + b[i]) (w[i] = 1, b[i] = 0 where the call has no
// weight or bias: then v[i] * factor[i] exactly).
template <int N>
__device__ __forceinline__ void normalize_each(float (&v)[N], const float (&factor)[N], const float (&w)[N],
                                               const float (&b)[N], const ChannelRMSNorm& p) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = fmaf(v[i] * factor[i], w[i], b[i]);
  activate_each(ActivationParams{p.activation.kind, p.activation.parameter}, v, [](int) { return 0; });
}

// The affine's values of channels c0, c0 + 1, ... (kVector of them, a 16-byte aligned
// vector of W, or the same channel's N times), or its identity's where absent.
template <int N, class W>
__device__ __forceinline__ void affine_values(const ChannelRMSNorm& p, int64_t c0, bool per_element, float (&w)[N],
                                              float (&b)[N]) {
  const W* weight = static_cast<const W*>(p.weight);
  const W* bias = static_cast<const W*>(p.bias);
  if (per_element) {
    static_assert(N == kVector || N <= 2);
    if constexpr (N == kVector) {
      if (weight != nullptr) load_vector(weight + c0, w);
      if (bias != nullptr) load_vector(bias + c0, b);
    }
  }
  const float wc = weight != nullptr && !per_element ? to_float(weight[c0]) : 1.f;
  const float bc = bias != nullptr && !per_element ? to_float(bias[c0]) : 0.f;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (weight == nullptr || !per_element) w[i] = wc;
    if (bias == nullptr || !per_element) b[i] = bc;
  }
}

// Channels-last: a group of `lanes` lanes (a power of two up to 32) per pixel, lane l
// holding the pixel's 16-byte vectors l, l + lanes, ... in registers; the group's sum by
// shuffles in a fixed order.
template <class T, class W>
__global__ void __launch_bounds__(kThreads)
channel_rms_norm_channels_last_kernel(const T* __restrict__ input, T* __restrict__ out, const ChannelRMSNorm p,
                                      int lanes, int64_t total_pixels) {
  const int lane = threadIdx.x % lanes;
  const int64_t pixel = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / lanes;
  const bool active = pixel < total_pixels;  // every lane takes part in the shuffles
  const auto vectors = static_cast<int>(p.channels / kVector);
  const int64_t first = pixel * p.channels;
  float e[kMaxVectors][kVector];
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    if (active && lane + r * lanes < vectors) load_vector(input + first + (lane + r * lanes) * kVector, e[r]);
  }
  float sum = 0.f;
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    if (active && lane + r * lanes < vectors) {
#pragma unroll
      for (int i = 0; i < kVector; ++i) sum = fmaf(e[r][i], e[r][i], sum);
    }
  }
  for (int offset = lanes / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (!active) return;
  float factor[kVector];
#pragma unroll
  for (int i = 0; i < kVector; ++i) factor[i] = inverse_rms(sum, p);
#pragma unroll
  for (int r = 0; r < kMaxVectors; ++r) {
    const int v = lane + r * lanes;
    if (v < vectors) {
      float w[kVector], b[kVector];
      affine_values<kVector, W>(p, int64_t{v} * kVector, true, w, b);
      normalize_each(e[r], factor, w, b, p);
      store_vector(out + first + v * kVector, e[r]);
    }
  }
}

// kPixels (1 or 2) adjacent elements as float, in one access.
template <int kPixels, class T>
struct alignas(kPixels * sizeof(T)) Pixels {
  T v[kPixels];
};

template <int kPixels, class T>
__device__ __forceinline__ void load_pixels(const T* src, float (&v)[kPixels]) {
  const Pixels<kPixels, T> raw = *reinterpret_cast<const Pixels<kPixels, T>*>(src);
#pragma unroll
  for (int j = 0; j < kPixels; ++j) v[j] = to_float(raw.v[j]);
}

template <int kPixels, class T>
__device__ __forceinline__ void store_pixels(T* dst, const float (&v)[kPixels]) {
  Pixels<kPixels, T> raw;
#pragma unroll
  for (int j = 0; j < kPixels; ++j) raw.v[j] = from_float<T>(v[j]);
  *reinterpret_cast<Pixels<kPixels, T>*>(dst) = raw;
}

// Planes of channels: a block per 32 * kPixels pixels of one plane, a lane per kPixels
// adjacent pixels; warp w sums channels w, w + kWarps, ...; the warps' sums added in
// shared memory in a fixed order; the channels read again (from L1) and written.
template <class T, class W, int kPixels>
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
    float e[kPixels], w[kPixels], b[kPixels];
    load_pixels<kPixels>(input + i, e);
    affine_values<kPixels, W>(p, c, false, w, b);
    normalize_each(e, factor, w, b, p);
    store_pixels<kPixels>(out + i, e);
  }
}

// The lanes per pixel of channels-last input: enough for kMaxVectors vectors a lane.
int lanes_for(int64_t vectors) {
  int lanes = 1;
  while (lanes < 32 && lanes * kMaxVectors < vectors) lanes *= 2;
  return lanes;
}

template <class T, class W, int kPixels>
void launch_planes(const T* in, T* y, const ChannelRMSNorm& p, cudaStream_t stream) {
  const int64_t tiles_per_plane = ceil_div(p.pixels, int64_t{32 * kPixels});
  const auto blocks = static_cast<unsigned>(p.planes * tiles_per_plane);
  channel_rms_norm_planes_kernel<T, W, kPixels><<<blocks, kThreads, 0, stream>>>(in, y, p, tiles_per_plane);
  check_launch("channel_rms_norm_planes_kernel");
}

template <class T, class W>
void launch(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  const T* in = static_cast<const T*>(input);
  T* y = static_cast<T*>(out);
  if (p.channels_last) {
    const int lanes = lanes_for(p.channels / kVector);
    const int64_t total_pixels = p.planes * p.pixels;
    const auto blocks = static_cast<unsigned>(ceil_div(total_pixels * lanes, int64_t{kThreads}));
    channel_rms_norm_channels_last_kernel<T, W><<<blocks, kThreads, 0, stream>>>(in, y, p, lanes, total_pixels);
    check_launch("channel_rms_norm_channels_last_kernel");
  } else if (p.pixels % 2 == 0 && p.planes * p.pixels >= kPairedPixelsFrom && aligned(input, 2 * sizeof(T)) &&
             aligned(out, 2 * sizeof(T))) {
    launch_planes<T, W, 2>(in, y, p, stream);
  } else {
    launch_planes<T, W, 1>(in, y, p, stream);
  }
}

template <class T>
void launch_for_affine(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  if (p.affine_element == ElementType::kFloat32) return launch<T, float>(input, out, p, stream);
  if constexpr (element_of<T>() != ElementType::kFloat32) {
    if (p.affine_element == element_of<T>()) return launch<T, T>(input, out, p, stream);
  }
  throw std::invalid_argument("cutlassfuse: channel_rms_norm's weight and bias are float32 or the input's type");
}

}  // namespace

bool channel_rms_norm_takes(const ChannelRMSNorm& p) {
  const int64_t elements = p.planes * p.channels * p.pixels;
  const bool affine_aligned =
      (p.weight == nullptr || aligned(p.weight, 16)) && (p.bias == nullptr || aligned(p.bias, 16));
  return elements > 0 && elements <= INT32_MAX && p.activation.kind != ActivationKind::kPReLU &&
         (p.affine_element == ElementType::kFloat32 || p.affine_element == p.element) &&
         (!p.channels_last ||
          (p.channels % kVector == 0 && p.channels <= 32 * kMaxVectors * kVector && affine_aligned));
}

void channel_rms_norm(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream) {
  if (!channel_rms_norm_takes(p) || (p.channels_last && !(aligned(input, 16) && aligned(out, 16))))
    throw std::invalid_argument(
        "cutlassfuse: channel_rms_norm takes 1 to 2^31 - 1 elements, an activation other than PReLU, weight and "
        "bias of float32 or the input's type, and channels-last tensors only with channels a multiple of 8 up to "
        "1024 and pointers aligned to 16 bytes");
  switch (p.element) {
    case ElementType::kFloat16: return launch_for_affine<__half>(input, out, p, stream);
    case ElementType::kBFloat16: return launch_for_affine<__nv_bfloat16>(input, out, p, stream);
    default: return launch_for_affine<float>(input, out, p, stream);
  }
}

}  // namespace cutlassfuse
