// A convolution's bias, and a residual, added in one pass. See cutlassfuse/common/bias_add.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>
#include <stdexcept>

#include "cutlassfuse/common/bias_add.h"
#include "cutlassfuse/common/device_utils.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kBytes = 16;

template <class T, int N>
struct alignas(N * sizeof(T)) Elements {
  T v[N];
};

// Each thread adds N elements: 16 bytes, or one where the sizes or pointers do not allow
// 16. Element e's channel is (e / plane) % channels. With N > 1 the host guarantees that
// a vector's N elements lie in one channel's plane (NCDHW: plane % N == 0) or in
// consecutive channels of one pixel (channels-last: plane == 1, channels % N == 0).
// kChannels: the N elements are N channels, whose biases are read as one vector too.
template <class T, int N, bool kChannels>
__global__ void __launch_bounds__(kThreads)
bias_add_kernel(const T* __restrict__ input, const T* __restrict__ bias, const T* __restrict__ residual,
                T* __restrict__ out, uint32_t vectors, FastDivisor plane, FastDivisor channels) {
  const uint32_t v = blockIdx.x * kThreads + threadIdx.x;
  if (v < vectors) {
    const uint32_t first = v * N;
    const uint32_t plane_index = plane.quotient(first);
    const uint32_t channel = channels.remainder(plane_index, channels.quotient(plane_index));
    const auto x = reinterpret_cast<const Elements<T, N>*>(input)[v];
    Elements<T, N> r{};
    if (residual != nullptr) r = reinterpret_cast<const Elements<T, N>*>(residual)[v];
    Elements<T, N> b;
    if constexpr (kChannels) {
      b = *reinterpret_cast<const Elements<T, N>*>(bias + channel);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) b.v[i] = bias[channel];
    }
    Elements<T, N> y;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float sum = to_float(x.v[i]) + to_float(b.v[i]);
      if (residual != nullptr) sum += to_float(r.v[i]);
      y.v[i] = from_float<T>(sum);
    }
    reinterpret_cast<Elements<T, N>*>(out)[v] = y;
  }
}

bool aligned(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % kBytes == 0; }

template <class T>
void launch(const void* input, const void* bias, const void* residual, void* out, const BiasAdd& p,
            cudaStream_t stream) {
  constexpr int kWide = kBytes / sizeof(T);
  const bool channels_last = p.plane == 1;
  const bool wide = (channels_last ? p.channels % kWide == 0 && aligned(bias) : p.plane % kWide == 0) &&
                    aligned(input) && aligned(residual) && aligned(out);
  const int64_t vectors = p.elements / (wide ? kWide : 1);
  const auto blocks = static_cast<unsigned>(ceil_div(vectors, kThreads));
  const auto args = [&](auto* kernel) {
    kernel<<<blocks, kThreads, 0, stream>>>(
        static_cast<const T*>(input), static_cast<const T*>(bias), static_cast<const T*>(residual),
        static_cast<T*>(out), static_cast<uint32_t>(vectors), FastDivisor(p.plane), FastDivisor(p.channels));
  };
  if (!wide)
    args(bias_add_kernel<T, 1, false>);
  else if (channels_last)
    args(bias_add_kernel<T, kWide, true>);
  else
    args(bias_add_kernel<T, kWide, false>);
  check_launch("bias_add");
}

}  // namespace

bool bias_add_takes(const BiasAdd& p) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  return p.elements >= 1 && p.elements <= kMax && p.channels >= 1 && p.plane >= 1 &&
         p.elements % (p.channels * p.plane) == 0;
}

void bias_add(const void* input, const void* bias, const void* residual, void* out, const BiasAdd& p,
              cudaStream_t stream) {
  if (!bias_add_takes(p))
    throw std::invalid_argument("cutlassfuse: bias_add takes non-empty tensors of up to 2^31 - 1 elements");
  switch (p.element) {
    case ElementType::kFloat16: return launch<__half>(input, bias, residual, out, p, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(input, bias, residual, out, p, stream);
    default: return launch<float>(input, bias, residual, out, p, stream);
  }
}

}  // namespace cutlassfuse
