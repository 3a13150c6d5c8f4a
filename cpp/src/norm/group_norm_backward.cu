// ReLU + GroupNorm backward. See cutlassfuse/norm/group_norm_backward.h.
//
// With x^ = (a - mean) * rstd over a (sample, group) of K = channels_per_group * spatial
// elements and out = x^ * gamma + beta, GroupNorm's input gradient is
//   da = rstd * (gamma dy - A / K - x^ B / K),  A = sum gamma dy,  B = sum gamma dy x^,
// and with the per-channel sums S1 = sum dy, S2 = sum dy a:
//   A = sum_c gamma_c S1_c,  B = rstd * sum_c gamma_c (S2_c - mean S1_c),
//   da = c1 dy + c2 a + c3,  c1 = rstd gamma_c,  c2 = -rstd^2 B / K,  c3 = -rstd A / K - mean c2;
//   dgamma_c = sum_n rstd (S2_c - mean S1_c),  dbeta_c = sum_n S1_c.
// ReLU's backward zeroes da where a <= 0 (PyTorch's threshold_backward on the output).
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_backward.h"
#include "cutlassfuse/norm/group_norm_finalize.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;

// A block's threads over a chunk of a sample's rows: consecutive threads take
// consecutive runs of kWidth channels (coalesced; 16 bytes each when kWidth = kVector),
// `row_lanes` groups of them interleave the rows.
template <int kWidth>
struct ChunkLanes {
  int cols;       // threads along the channels
  int row_lanes;  // groups of `cols` threads along the rows
  int col;        // this thread's
  int row_lane;   // this thread's; >= row_lanes: idle

  __device__ explicit ChunkLanes(int64_t channels) {
    const int64_t runs = channels / kWidth;
    cols = runs < kThreads ? static_cast<int>(runs) : kThreads;
    row_lanes = kThreads / cols;
    col = static_cast<int>(threadIdx.x) % cols;
    row_lane = static_cast<int>(threadIdx.x) / cols;
  }
  __device__ int64_t channel_step() const { return int64_t{cols} * kWidth; }
};

struct Chunk {
  int64_t n;
  int64_t chunk;
  int64_t row_begin;  // global rows (n * spatial + pixel)
  int64_t row_end;

  __device__ explicit Chunk(const GroupNormBackwardShape& s) {
    n = blockIdx.y;
    chunk = blockIdx.x;
    const int64_t first = chunk * s.rows_per_chunk;
    row_begin = n * s.norm.spatial + first;
    row_end = n * s.norm.spatial + std::min(s.norm.spatial, first + s.rows_per_chunk);
  }
  __device__ int64_t slot(const GroupNormBackwardShape& s, int64_t c) const {
    return (n * s.chunks + chunk) * s.norm.channels + c;
  }
};

__device__ __forceinline__ float2 operator+(float2 a, float2 b) { return {a.x + b.x, a.y + b.y}; }

// kWidth consecutive elements as floats: one 16-byte access, or one element.
template <int kWidth, class T>
__device__ __forceinline__ void load_run(const T* src, float (&v)[kWidth]) {
  if constexpr (kWidth == kVector) {
    load_vector(src, v);
  } else {
    v[0] = to_float(*src);
  }
}

template <int kWidth, class T>
__device__ __forceinline__ void store_run(T* dst, const float (&v)[kWidth]) {
  if constexpr (kWidth == kVector) {
    store_vector(dst, v);
  } else {
    *dst = from_float<T>(v[0]);
  }
}

// Sums the lane groups' values of one column in a fixed order (lane group 0 first); the
// total is valid at row lane 0. Every thread of the block must call it.
template <class V, int kWidth>
__device__ V reduce_row_lanes(V value, const ChunkLanes<kWidth>& lanes, V* scratch, V zero) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  V total = zero;
  if (lanes.row_lane == 0) {
    for (int l = 0; l < lanes.row_lanes; ++l) total = total + scratch[l * lanes.cols + lanes.col];
  }
  __syncthreads();
  return total;
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads)
backward_sums_kernel(const T* __restrict__ dy, const T* __restrict__ a, const GroupNormBackwardShape shape,
                     float2* __restrict__ sums) {
  __shared__ float2 scratch[kThreads];
  const int64_t channels = shape.norm.channels;
  const ChunkLanes<kWidth> lanes(channels);
  const Chunk chunk(shape);
  for (int64_t c0 = 0; c0 < channels; c0 += lanes.channel_step()) {
    const int64_t c = c0 + int64_t{lanes.col} * kWidth;
    float2 s[kWidth] = {};
    if (lanes.row_lane < lanes.row_lanes && c < channels) {
      for (int64_t r = chunk.row_begin + lanes.row_lane; r < chunk.row_end; r += lanes.row_lanes) {
        float g[kWidth], av[kWidth];
        load_run<kWidth>(dy + r * channels + c, g);
        load_run<kWidth>(a + r * channels + c, av);
#pragma unroll
        for (int k = 0; k < kWidth; ++k) {
          s[k].x += g[k];
          s[k].y = fmaf(g[k], av[k], s[k].y);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float2 total = reduce_row_lanes(s[k], lanes, scratch, float2{0.f, 0.f});
      if (lanes.row_lane == 0 && c < channels) sums[chunk.slot(shape, c + k)] = total;
    }
  }
}

// One block per (sample, group), grid (num_groups, batch): the threads split the chunks
// of each of the group's channels, then the group's totals go through a fixed tree.
__global__ void __launch_bounds__(kThreads)
backward_coefficients_kernel(const GroupNormBackwardShape shape, const float* __restrict__ mean,
                             const float* __restrict__ rstd, const void* gamma, ElementType affine_element,
                             const GroupNormBackwardTerms terms) {
  __shared__ float2 scratch[kThreads];
  const int64_t n = blockIdx.y;
  const int g = static_cast<int>(blockIdx.x);
  const GroupNormShape& s = shape.norm;
  const int64_t cpg = s.channels / s.num_groups;
  const float m = mean[n * s.num_groups + g];
  const float r = rstd[n * s.num_groups + g];
  const ChunkLanes<1> lanes(cpg);
  float2 ab{0.f, 0.f};  // this thread's share of (A, sum gamma (S2 - mean S1))
  for (int64_t c0 = 0; c0 < cpg; c0 += lanes.channel_step()) {
    const int64_t c = g * cpg + c0 + lanes.col;
    const bool active = lanes.row_lane < lanes.row_lanes && c0 + lanes.col < cpg;
    float2 part{0.f, 0.f};
    if (active) {
      for (int64_t k = lanes.row_lane; k < shape.chunks; k += lanes.row_lanes) {
        part = part + terms.sums[(n * shape.chunks + k) * s.channels + c];
      }
    }
    const float2 total = reduce_row_lanes(part, lanes, scratch, float2{0.f, 0.f});
    if (lanes.row_lane == 0 && active) {
      const float gamma_c = load_affine(gamma, affine_element, c, 1.f);
      const float centered = fmaf(-m, total.x, total.y);  // S2 - mean S1
      ab.x = fmaf(gamma_c, total.x, ab.x);
      ab.y = fmaf(gamma_c, centered, ab.y);
      terms.scale_dy[n * s.channels + c] = r * gamma_c;
      terms.affine_terms[n * s.channels + c] = {r * centered, total.x};
    }
  }
  // The block's sum in a fixed order: a tree over the threads.
  scratch[threadIdx.x] = ab;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    const float k = static_cast<float>(cpg) * static_cast<float>(s.spatial);
    const float a_sum = scratch[0].x;
    const float b_sum = r * scratch[0].y;
    const float c2 = -r * r * b_sum / k;
    terms.group_terms[n * s.num_groups + g] = {c2, fmaf(-m, c2, -r * a_sum / k)};
  }
}

// dz may be dy itself (each element is read, then written, by the same thread), so those
// two pointers are not __restrict__.
template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads)
backward_grad_kernel(const T* dy, const T* __restrict__ a, const GroupNormBackwardShape shape,
                     const GroupNormBackwardTerms terms, T* dz) {
  __shared__ float scratch[kThreads];
  const int64_t channels = shape.norm.channels;
  const int64_t cpg = channels / shape.norm.num_groups;
  const ChunkLanes<kWidth> lanes(channels);
  const Chunk chunk(shape);
  for (int64_t c0 = 0; c0 < channels; c0 += lanes.channel_step()) {
    const int64_t c = c0 + int64_t{lanes.col} * kWidth;
    float bias_sum[kWidth] = {};
    if (lanes.row_lane < lanes.row_lanes && c < channels) {
      float c1[kWidth];
      float2 c23[kWidth];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        c1[k] = terms.scale_dy[chunk.n * channels + c + k];
        c23[k] = terms.group_terms[chunk.n * shape.norm.num_groups + (c + k) / cpg];
      }
      for (int64_t r = chunk.row_begin + lanes.row_lane; r < chunk.row_end; r += lanes.row_lanes) {
        const int64_t i = r * channels + c;
        float g[kWidth], av[kWidth], v[kWidth];
        load_run<kWidth>(dy + i, g);
        load_run<kWidth>(a + i, av);
#pragma unroll
        for (int k = 0; k < kWidth; ++k) {
          // threshold_backward's rule: zero where a <= 0 (a NaN activation passes).
          v[k] = av[k] <= 0.f ? 0.f : fmaf(c1[k], g[k], fmaf(c23[k].x, av[k], c23[k].y));
          bias_sum[k] += v[k];
        }
        store_run<kWidth>(dz + i, v);
      }
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float total = reduce_row_lanes(bias_sum[k], lanes, scratch, 0.f);
      if (lanes.row_lane == 0 && c < channels) terms.bias_terms[chunk.slot(shape, c + k)] = total;
    }
  }
}

// Block (32 channels, 8 row lanes), grid over the channel tiles: each lane sums every
// 8th row of the per-sample and per-chunk terms, then lane 0 adds the lanes in order.
constexpr int kParameterColumns = 32;
constexpr int kParameterLanes = kThreads / kParameterColumns;

__global__ void __launch_bounds__(kThreads)
parameter_grads_kernel(const GroupNormBackwardShape shape, const GroupNormBackwardTerms terms,
                       const ParameterGradients out) {
  __shared__ float3 scratch[kParameterLanes][kParameterColumns];
  const int64_t channels = shape.norm.channels;
  const int col = static_cast<int>(threadIdx.x) % kParameterColumns;
  const int lane = static_cast<int>(threadIdx.x) / kParameterColumns;
  const int64_t c = int64_t{blockIdx.x} * kParameterColumns + col;
  float3 part{0.f, 0.f, 0.f};  // (dgamma, dbeta, dbias)
  if (c < channels) {
    for (int64_t n = lane; n < shape.norm.batch; n += kParameterLanes) {
      const float2 t = terms.affine_terms[n * channels + c];
      part.x += t.x;
      part.y += t.y;
    }
    for (int64_t r = lane; r < shape.norm.batch * shape.chunks; r += kParameterLanes) {
      part.z += terms.bias_terms[r * channels + c];
    }
  }
  scratch[lane][col] = part;
  __syncthreads();
  if (lane == 0 && c < channels) {
    float3 total = scratch[0][col];
    for (int l = 1; l < kParameterLanes; ++l) {
      total.x += scratch[l][col].x;
      total.y += scratch[l][col].y;
      total.z += scratch[l][col].z;
    }
    out.gamma[c] = total.x;
    out.beta[c] = total.y;
    out.bias[c] = total.z;
  }
}

dim3 chunk_grid(const GroupNormBackwardShape& s) {
  return dim3(static_cast<unsigned>(s.chunks), static_cast<unsigned>(s.norm.batch));
}

template <class F>
void with_type(ElementType element, F&& f) {
  switch (element) {
    case ElementType::kFloat16: return f(__half{});
    case ElementType::kBFloat16: return f(__nv_bfloat16{});
    default: return f(float{});
  }
}

// 16-byte runs of channels where every row starts 16-byte aligned.
bool vector_rows(int64_t channels, std::initializer_list<const void*> pointers) {
  if (channels % kVector != 0) return false;
  return std::all_of(pointers.begin(), pointers.end(),
                     [](const void* p) { return reinterpret_cast<uintptr_t>(p) % sizeof(uint4) == 0; });
}

}  // namespace

GroupNormBackwardShape GroupNormBackwardShape::plan(const GroupNormShape& norm, int sm_count) {
  // Eight blocks per SM in all, chunks of at least 64 pixels.
  const int64_t wanted = ceil_div(int64_t{8} * sm_count, std::max<int64_t>(norm.batch, 1));
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(ceil_div(norm.spatial, 64), 1));
  const int64_t rows = std::max<int64_t>(ceil_div(norm.spatial, chunks), 1);
  return {norm, rows, ceil_div(norm.spatial, rows)};
}

void relu_group_norm_backward_sums(ElementType element, const void* dy, const void* activation,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const auto* dy_t = static_cast<const T*>(dy);
    const auto* a_t = static_cast<const T*>(activation);
    if (vector_rows(shape.norm.channels, {dy, activation})) {
      backward_sums_kernel<T, kVector><<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, a_t, shape, terms.sums);
    } else {
      backward_sums_kernel<T, 1><<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, a_t, shape, terms.sums);
    }
  });
  check_launch("backward_sums_kernel");
}

void relu_group_norm_backward_coefficients(const GroupNormBackwardShape& shape, const float* mean, const float* rstd,
                                           const void* gamma, ElementType affine_element,
                                           const GroupNormBackwardTerms& terms, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(shape.norm.num_groups), static_cast<unsigned>(shape.norm.batch));
  backward_coefficients_kernel<<<grid, kThreads, 0, stream>>>(shape, mean, rstd, gamma, affine_element, terms);
  check_launch("backward_coefficients_kernel");
}

void relu_group_norm_backward_grad(ElementType element, const void* dy, const void* activation,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   void* grad_pre_activation, cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const auto* dy_t = static_cast<const T*>(dy);
    const auto* a_t = static_cast<const T*>(activation);
    auto* dz = static_cast<T*>(grad_pre_activation);
    if (vector_rows(shape.norm.channels, {dy, activation, grad_pre_activation})) {
      backward_grad_kernel<T, kVector><<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, a_t, shape, terms, dz);
    } else {
      backward_grad_kernel<T, 1><<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, a_t, shape, terms, dz);
    }
  });
  check_launch("backward_grad_kernel");
}

void relu_group_norm_backward_parameter_grads(const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                              const ParameterGradients& out, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(ceil_div(shape.norm.channels, int64_t{kParameterColumns}));
  parameter_grads_kernel<<<blocks, kThreads, 0, stream>>>(shape, terms, out);
  check_launch("parameter_grads_kernel");
}

}  // namespace cutlassfuse
