// Small device helpers shared by cutlassfuse's own (non-CUTLASS) kernels: element
// conversions, 16-byte vector access to 16-bit elements, an activation's constant per
// channel, and launch checking.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/problem.h"  // ceil_div

namespace cutlassfuse {

// Every thread moves 16 bytes at a time: 8 elements of a 16-bit type.
constexpr int kVector = 8;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// p[i] of a tensor of element type `type`, as float.
__device__ __forceinline__ float load_as_float(const void* p, ElementType type, int64_t i) {
  switch (type) {
    case ElementType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case ElementType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// The constant activate(K, ...) takes for a channel: PReLU's slope of that channel,
// read from its weight (one slope for every channel, or one per channel), the
// activation's parameter otherwise.
template <ActivationKind K>
__device__ __forceinline__ float activation_parameter(const ActivationParams& a, int64_t channel) {
  if constexpr (K == ActivationKind::kPReLU) {
    return load_as_float(a.slopes, a.slopes_element, a.slope_count == 1 ? 0 : channel);
  } else {
    return a.parameter;
  }
}

template <class F, int... K>
__device__ __forceinline__ void dispatch_activation(ActivationKind kind, const F& f, std::integer_sequence<int, K...>) {
  (void)((kind == static_cast<ActivationKind>(K) &&
          (f(std::integral_constant<ActivationKind, static_cast<ActivationKind>(K)>{}), true)) ||
         ...);
}

// f(std::integral_constant<ActivationKind, kind>{}): the caller's code compiled with the
// kind known, one branch on it for all that code does.
template <class F>
__device__ __forceinline__ void dispatch_activation(ActivationKind kind, const F& f) {
  dispatch_activation(kind, f, std::make_integer_sequence<int, std::size(kActivationNames)>{});
}

// v[i] = activate(a.kind, v[i], parameter of channel(i)) for the N values, branching on
// the kind once for all of them: each kind's loop is compiled with the kind known, so
// a batch costs the activation itself (ReLU: one instruction a value) and one
// dispatch, and only PReLU reads its slopes.
template <int N, class Channel>
__device__ __forceinline__ void activate_each(const ActivationParams& a, float (&v)[N], const Channel& channel) {
  dispatch_activation(a.kind, [&](auto known) {
    constexpr ActivationKind kKind = decltype(known)::value;
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = activate(kKind, v[i], activation_parameter<kKind>(a, channel(i)));
  });
}

// Division by a divisor fixed for many dividends (at launch, or for a warp's share of
// a kernel's work), for dividends below 2^31, as a multiply-high
// (Granlund and Montgomery): per-vector index arithmetic otherwise costs a software
// integer division (tens of instructions, hundreds in 64 bits) per 16 bytes moved.
class FastDivisor {
 public:
  FastDivisor() = default;
  __host__ __device__ explicit FastDivisor(uint32_t divisor) : divisor_(divisor) {
    while ((uint64_t{1} << shift_) < divisor) ++shift_;
    multiplier_ = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift_) - divisor)) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t quotient(uint32_t n) const {
    return static_cast<uint32_t>((uint64_t{__umulhi(n, multiplier_)} + n) >> shift_);
  }
  __device__ __forceinline__ uint32_t remainder(uint32_t n, uint32_t quotient) const { return n - quotient * divisor_; }

 private:
  uint32_t divisor_ = 1;
  uint32_t multiplier_ = 1;
  uint32_t shift_ = 0;
};

// Multiplication by 2^e as two factors, each a normal float32 for |e| up to 250: exact
// wherever the result is a normal float32, and no intermediate overflows.
struct PowerOfTwo {
  float low, high;
  __device__ explicit PowerOfTwo(int e) : low(ldexpf(1.f, e / 2)), high(ldexpf(1.f, e - e / 2)) {}
  __device__ float times(float v) const { return v * low * high; }
};

// ReLU as PyTorch's: NaN propagates.
__device__ __forceinline__ float relu(float v) { return v > 0.f || v != v ? v : 0.f; }

// float: two 16-byte accesses per kVector elements.
__device__ __forceinline__ void load_vector(const float* src, float (&v)[kVector]) {
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 b = *reinterpret_cast<const float4*>(src + 4);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void store_vector(float* dst, const float (&v)[kVector]) {
  *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
}

template <class T>
__device__ __forceinline__ void load_vector(const T* src, float (&v)[kVector]) {
  static_assert(sizeof(T) * kVector == sizeof(uint4));
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
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

inline void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: launching ") + kernel + " failed: " + cudaGetErrorString(error));
  }
}

}  // namespace cutlassfuse
