// What the generic GroupNorm kernels share (cutlassfuse/norm/group_norm_generic.h): the
// value the norm reads, pre(y) = activation(y + bias), as the statistics
// (norm_statistics.cu), the normalize (group_norm_generic.cu) and the resident kernel
// (group_norm_resident.cu) take it, the residual's add, and on the host the pointers'
// alignment check, launch errors and the dispatch of launches on the element type.
#pragma once

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_generic.h"

namespace cutlassfuse {

// PreNorm as the kernels take it.
template <class T>
struct PreTerms {
  const T* bias;  // null: none
  ActivationParams activation;

  __device__ float bias_at(int channel) const { return bias == nullptr ? 0.f : to_float(bias[channel]); }
  // pre(y) = y: no bias, no activation before the norm.
  __host__ __device__ bool is_identity() const {
    return bias == nullptr && activation.kind == ActivationKind::kIdentity;
  }
};

template <class T>
PreTerms<T> pre_terms(const PreNorm& pre) {
  return {static_cast<const T*>(pre.bias), pre.activation};
}

// pre() of kChannels fixed channels, their constants read once: the bias and the
// activation's parameter (PReLU's slope of the channel).
template <int kChannels>
struct ChannelTerms {
  ActivationKind kind;
  float bias[kChannels];
  float parameter[kChannels];

  // Channels channel(0) .. channel(count - 1); past them, zeros.
  template <class T, class Channel>
  __device__ ChannelTerms(const PreTerms<T>& pre, const Channel& channel, int count) : kind(pre.activation.kind) {
    with_activation_kind(kind, [&](auto known) {
      constexpr ActivationKind kKind = decltype(known)::value;
#pragma unroll
      for (int i = 0; i < kChannels; ++i) {
        const bool valid = i < count;
        bias[i] = valid ? pre.bias_at(channel(i)) : 0.f;
        parameter[i] = valid ? activation_parameter<kKind>(pre.activation, channel(i)) : 0.f;
      }
    });
  }

  // v[i] = pre(v[i]), v[i] of the term(i)-th channel; one branch on the kind for every
  // four values (more at once keep more of an activation's intermediates live).
  template <int N, class Term>
  __device__ __forceinline__ void apply(float (&v)[N], const Term& term) const {
#pragma unroll
    for (int first = 0; first < N; first += 4) {
      with_activation_kind(kind, [&](auto known) {
        constexpr ActivationKind kKind = decltype(known)::value;
#pragma unroll
        for (int i = first; i < min(first + 4, N); ++i)
          v[i] = activate(kKind, v[i] + bias[term(i)], parameter[term(i)]);
      });
    }
  }
};

// v = pre(v) for kVector values of one channel c: its bias and the activation's
// parameter read once, one branch on the kind.
template <class T>
__device__ __forceinline__ void apply_pre_to_channel(const PreTerms<T>& pre, float (&v)[kVector], int channel) {
  const float bias = pre.bias_at(channel);
  with_activation_kind(pre.activation.kind, [&](auto known) {
    constexpr ActivationKind kKind = decltype(known)::value;
    const float parameter = activation_parameter<kKind>(pre.activation, channel);
#pragma unroll
    for (int i = 0; i < kVector; ++i) v[i] = activate(kKind, v[i] + bias, parameter);
  });
}

// v[i] = pre(v[i]) = activation(v[i] + bias), v[i] of channel(i).
template <class T, int N, class Channel>
__device__ __forceinline__ void apply_pre(const PreTerms<T>& pre, float (&v)[N], const Channel& channel) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] += pre.bias_at(channel(i));
  activate_each(pre.activation, v, channel);
}

// v += the residual's vector at `index` (a block's residual connection), where one is given.
template <class T>
__device__ __forceinline__ void add_residual(const T* __restrict__ residual, int64_t index, float (&v)[kVector]) {
  if (residual == nullptr) return;
  float r[kVector];
  load_vector(residual + index, r);
#pragma unroll
  for (int k = 0; k < kVector; ++k) v[k] += r[k];
}

// Whether p may take 16-byte vector accesses (null counts: nothing is accessed).
inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw std::runtime_error(std::string("cutlassfuse: ") + what + ": " + cudaGetErrorString(error));
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

}  // namespace cutlassfuse
