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
};

template <class T>
PreTerms<T> pre_terms(const PreNorm& pre) {
  return {static_cast<const T*>(pre.bias), pre.activation};
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
