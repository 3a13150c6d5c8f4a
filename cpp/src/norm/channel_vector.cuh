// What the vector normalize kernels share (group_norm_generic.cu, group_norm_resident.cu):
// a thread's kVector channels with their constants in registers, and vectors of 16-bit
// or float elements held as loaded while other loads are in flight.
#pragma once

#include <iterator>

#include "norm/l2_policy.cuh"
#include "norm/norm_activation_terms.cuh"

namespace cutlassfuse {

// A thread's kVector consecutive channels of one sample, for a thread that normalizes
// only those channels: their constants read once into registers (the bias, scale and
// shift, and PReLU's slopes where the activation before or after the norm is PReLU, one
// of them at most), applied with the operations of apply_pre and apply_norm_after.
struct ChannelVector {
  int first;  // the first of the channels
  float bias[kVector];
  float2 scale_shift[kVector];
  float slopes[kVector];

  template <class T>
  __device__ __forceinline__ ChannelVector(const PreTerms<T>& pre, const ActivationParams& after,
                                           const float2* __restrict__ sample_scale_shift, int first_channel)
      : first(first_channel) {
    const ActivationParams prelu = pre.activation.kind == ActivationKind::kPReLU ? pre.activation : after;
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      bias[k] = pre.bias_at(first + k);
      scale_shift[k] = sample_scale_shift[first + k];
      slopes[k] =
          prelu.kind == ActivationKind::kPReLU ? activation_parameter<ActivationKind::kPReLU>(prelu, first + k) : 0.f;
    }
  }

  // Whether the registers hold every slope the activations need: one PReLU at most.
  static bool holds(const ActivationParams& pre, const ActivationParams& after) {
    return pre.kind != ActivationKind::kPReLU || after.kind != ActivationKind::kPReLU;
  }

  // v = pre(v) = activation(v + bias).
  __device__ __forceinline__ void apply_pre(const ActivationParams& activation, float (&v)[kVector]) const {
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] += bias[k];
    activate_with_slopes(activation, v);
  }

  // v = after(v * scale + shift).
  __device__ __forceinline__ void apply_norm_after(const ActivationParams& after, float (&v)[kVector]) const {
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = fmaf(v[k], scale_shift[k].x, scale_shift[k].y);
    activate_with_slopes(after, v);
  }

 private:
  // activate_each, PReLU's slopes taken from the registers.
  __device__ __forceinline__ void activate_with_slopes(const ActivationParams& a, float (&v)[kVector]) const {
    if (a.kind == ActivationKind::kPReLU) {
#pragma unroll
      for (int k = 0; k < kVector; ++k) v[k] = activate(ActivationKind::kPReLU, v[k], slopes[k]);
    } else {
      activate_each(a, v, [&](int k) { return first + k; });
    }
  }
};

// kVector values of T as loaded, converted to float where used: for 16-bit types half
// the registers that floats take while other loads are in flight.
template <class T>
struct LoadedVector {
  static constexpr int kWordElements = sizeof(uint4) / sizeof(T);
  uint4 words[kVector / kWordElements];

  __device__ __forceinline__ void load(const T* src) {
#pragma unroll
    for (int w = 0; w < static_cast<int>(std::size(words)); ++w) words[w] = reinterpret_cast<const uint4*>(src)[w];
  }

  // As load, with an L2 eviction priority.
  __device__ __forceinline__ void load(const T* src, L2Policy policy) {
#pragma unroll
    for (int w = 0; w < static_cast<int>(std::size(words)); ++w) words[w] = load_with(src + w * kWordElements, policy);
  }

  __device__ __forceinline__ void store(T* dst, L2Policy policy) const {
#pragma unroll
    for (int w = 0; w < static_cast<int>(std::size(words)); ++w) store_with(dst + w * kWordElements, words[w], policy);
  }

  __device__ __forceinline__ void pack(const float (&v)[kVector]) {
    T* values = reinterpret_cast<T*>(words);
#pragma unroll
    for (int k = 0; k < kVector; ++k) values[k] = from_float<T>(v[k]);
  }

  __device__ __forceinline__ void unpack(float (&v)[kVector]) const {
    const T* values = reinterpret_cast<const T*>(words);
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = to_float(values[k]);
  }
};

// Vectors a thread has in flight: 64 bytes, four of a 16-bit type, two of float.
template <class T>
constexpr int kUnroll = 64 / static_cast<int>(sizeof(T) * kVector);

}  // namespace cutlassfuse
