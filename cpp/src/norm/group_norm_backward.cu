// GroupNorm backward with ReLU before the norm (the ReLU op's) and with any activation
// before or after it (the block family's). See cutlassfuse/norm/group_norm_backward.h.
//
// With x^ = (a - mean) * rstd over a (sample, group) of K = channels_per_group * spatial
// elements and out = x^ * gamma + beta, GroupNorm's input gradient is
//   da = rstd * (gamma dy - A / K - x^ B / K),  A = sum gamma dy,  B = sum gamma dy x^,
// and with the per-channel sums S1 = sum dy, S2 = sum dy a:
//   A = sum_c gamma_c S1_c,  B = rstd * sum_c gamma_c (S2_c - mean S1_c),
//   da = c1 dy + c2 a + c3,  c1 = rstd gamma_c,  c2 = -rstd^2 B / K,  c3 = -rstd A / K - mean c2;
//   dgamma_c = sum_n rstd (S2_c - mean S1_c),  dbeta_c = sum_n S1_c.
// ReLU's backward zeroes da where a <= 0 (PyTorch's threshold_backward on the output).
// The block family's passes are these with x the norm's input and dn the gradient of
// the norm's output, both recomputed from the convolution's output y where they are read.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm_backward.h"
#include "cutlassfuse/norm/group_norm_finalize.cuh"
#include "cutlassfuse/norm/shuffle_index.cuh"

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
  int64_t sample_begin;  // global row of the sample's first pixel

  __device__ explicit Chunk(const GroupNormBackwardShape& s) {
    n = blockIdx.y;
    chunk = blockIdx.x;
    const int64_t first = chunk * s.rows_per_chunk;
    sample_begin = n * s.norm.spatial;
    row_begin = sample_begin + first;
    row_end = sample_begin + std::min(s.norm.spatial, first + s.rows_per_chunk);
  }
  // The activation's row of global row r: the same, or (kShuffled) where the pixel-shuffle
  // GEMM's space-to-depth order holds that pixel of the sample.
  template <bool kShuffled>
  __device__ int64_t activation_row(int64_t r, const ShuffleIndex& order) const {
    return sample_begin + source_row<kShuffled>(r - sample_begin, order);
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

// Sums `value` over the block's threads in a fixed order (a tree); the total is valid at
// thread 0. Every thread of the block must call it.
template <class V>
__device__ V reduce_block(V value, V* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) scratch[threadIdx.x] = scratch[threadIdx.x] + scratch[threadIdx.x + stride];
    __syncthreads();
  }
  return threadIdx.x == 0 ? scratch[0] : value;
}

template <class T, int kWidth, bool kShuffled>
__global__ void __launch_bounds__(kThreads)
backward_sums_kernel(const T* __restrict__ dy, const T* __restrict__ a, const ShuffleIndex order,
                     const GroupNormBackwardShape shape, float2* __restrict__ sums) {
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
        load_run<kWidth>(a + chunk.activation_row<kShuffled>(r, order) * channels + c, av);
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
  const float2 sum = reduce_block(ab, scratch);
  if (threadIdx.x == 0) {
    const float k = static_cast<float>(cpg) * static_cast<float>(s.spatial);
    const float a_sum = sum.x;
    const float b_sum = r * sum.y;
    const float c2 = -r * r * b_sum / k;
    terms.group_terms[n * s.num_groups + g] = {c2, fmaf(-m, c2, -r * a_sum / k)};
  }
}

// dz may be dy itself (each element is read, then written, by the same thread), so those
// two pointers are not __restrict__.
template <class T, int kWidth, bool kShuffled>
__global__ void __launch_bounds__(kThreads)
backward_grad_kernel(const T* dy, const T* __restrict__ a, const ShuffleIndex order, const GroupNormBackwardShape shape,
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
        load_run<kWidth>(a + chunk.activation_row<kShuffled>(r, order) * channels + c, av);
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
  __shared__ float4 scratch[kParameterLanes][kParameterColumns];
  const int64_t channels = shape.norm.channels;
  const int col = static_cast<int>(threadIdx.x) % kParameterColumns;
  const int lane = static_cast<int>(threadIdx.x) / kParameterColumns;
  const int64_t c = int64_t{blockIdx.x} * kParameterColumns + col;
  const bool slopes = out.slopes != nullptr;
  float4 part{0.f, 0.f, 0.f, 0.f};  // (dgamma, dbeta, dbias, dslope)
  if (c < channels) {
    for (int64_t n = lane; n < shape.norm.batch; n += kParameterLanes) {
      const float2 t = terms.affine_terms[n * channels + c];
      part.x += t.x;
      part.y += t.y;
    }
    for (int64_t r = lane; r < shape.norm.batch * shape.chunks; r += kParameterLanes) {
      part.z += terms.bias_terms[r * channels + c];
      if (slopes) part.w += terms.slope_terms[r * channels + c];
    }
  }
  scratch[lane][col] = part;
  __syncthreads();
  if (lane == 0 && c < channels) {
    float4 total = scratch[0][col];
    for (int l = 1; l < kParameterLanes; ++l) {
      total.x += scratch[l][col].x;
      total.y += scratch[l][col].y;
      total.z += scratch[l][col].z;
      total.w += scratch[l][col].w;
    }
    out.gamma[c] = total.x;
    out.beta[c] = total.y;
    out.bias[c] = total.z;
    if (slopes) out.slopes[c] = total.w;
  }
}

// --- the block family: the norm's input and the activation, recomputed from y -------------

// Blocks of the family's kernels an SM holds: register budgets (85 and 128 a thread)
// that hold every activation's code without spills. float32 sums take two, whose
// threads have twice the bytes of a 16-bit type in flight.
template <class T>
constexpr int kSumsBlocksPerSm = sizeof(T) == 4 ? 2 : 3;
constexpr int kGradBlocksPerSm = 2;

// NormActivationBackward as the kernels read it.
template <class T>
struct Recompute {
  const T* bias;  // null: none
  const float* mean;
  const float* rstd;
  GroupNormAffine affine;
  ActivationParams activation;
  bool before_norm;
  int64_t channels_per_group;
  int64_t num_groups;
};

template <class T>
__device__ float bias_of(const Recompute<T>& op, int64_t c) {
  return op.bias == nullptr ? 0.f : to_float(op.bias[c]);
}

// A channel's constants in one sample, for y as the passes read it (without the bias):
//   scale:  rstd gamma, the forward normalize's scale and the coefficient c1;
//   offset: before the norm the bias (x = act(y + offset)); after it the forward
//           normalize's shift, beta - mean scale, with the bias folded in (the
//           activation's input v = y * scale + offset);
//   c2, c3: the grad pass's coefficients of the channel's group, c3 with the bias folded
//           in after the norm (there x = y + bias, c2 x + c3 = c2 y + c3 + c2 bias).
struct ChannelTerms {
  float scale;
  float offset;
  float c2 = 0.f;
  float c3 = 0.f;
};

template <class T>
__device__ ChannelTerms channel_terms(const Recompute<T>& op, int64_t n, int64_t c) {
  const int64_t g = n * op.num_groups + c / op.channels_per_group;
  const float bias = bias_of(op, c);
  const float scale = op.rstd[g] * load_affine(op.affine.gamma, op.affine.element, c, 1.f);
  const float shift = load_affine(op.affine.beta, op.affine.element, c, 0.f) - op.mean[g] * scale;
  return {scale, op.before_norm ? bias : fmaf(bias, scale, shift)};
}

// channel_terms with the grad pass's coefficients (group_terms: (c2, c3) per (sample, group)).
template <class T>
__device__ ChannelTerms grad_terms(const Recompute<T>& op, const float2* group_terms, int64_t n, int64_t c) {
  ChannelTerms t = channel_terms(op, n, c);
  const float2 c23 = group_terms[n * op.num_groups + c / op.channels_per_group];
  t.c2 = c23.x;
  t.c3 = op.before_norm ? c23.y : fmaf(c23.x, bias_of(op, c), c23.y);
  return t;
}

// The sums pass on kVector values, value i of channel(i) with terms(i), in place: g (dy
// when called) becomes dn, the gradient of the norm's output, and v (y) what the pass
// sums the products with dn of: the norm's input before the norm; after it y itself,
// the sums then completed by complete_sums.
template <class T, class Terms, class Channel>
__device__ __forceinline__ void norm_gradient(const Recompute<T>& op, float (&v)[kVector], float (&g)[kVector],
                                              const Terms& terms, const Channel& channel) {
  if (op.before_norm) {
#pragma unroll
    for (int i = 0; i < kVector; ++i) v[i] += terms(i).offset;
    activate_each(op.activation, v, channel);
    return;
  }
  float d[kVector];
#pragma unroll
  for (int i = 0; i < kVector; ++i) d[i] = fmaf(v[i], terms(i).scale, terms(i).offset);
  derivative_each(op.activation, d, channel);
#pragma unroll
  for (int i = 0; i < kVector; ++i) g[i] *= d[i];
}

// A channel's (sum dn, sum dn * x) from norm_gradient's sums: after the norm
// sum dn * (y + bias) = sum dn * y + bias * sum dn.
template <class T>
__device__ float2 complete_sums(const Recompute<T>& op, int64_t c, float2 sums) {
  if (!op.before_norm) sums.y = fmaf(bias_of(op, c), sums.x, sums.y);
  return sums;
}

// PReLU's slope gradient term of an activation input v with output gradient g (PyTorch's:
// none where v > 0; NaN propagates).
__device__ __forceinline__ float slope_term(float g, float v) { return v > 0.f ? 0.f : g * v; }

// The grad pass on kVector values (terms from grad_terms), in place: g (dy when called)
// becomes dz; y is read; slope gets PReLU's slope terms.
template <class T, class Terms, class Channel>
__device__ __forceinline__ void input_gradient(const Recompute<T>& op, const float (&y)[kVector], float (&g)[kVector],
                                               float (&slope)[kVector], const Terms& terms, const Channel& channel) {
  if (op.before_norm) {
    with_activation_kind(op.activation.kind, [&](auto known) {
      constexpr ActivationKind kKind = decltype(known)::value;
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        const ChannelTerms t = terms(i);
        const float parameter = activation_parameter<kKind>(op.activation, channel(i));
        const float z = y[i] + t.offset;
        const float dx = fmaf(t.scale, g[i], fmaf(t.c2, activate(kKind, z, parameter), t.c3));
        slope[i] = slope_term(dx, z);
        g[i] = dx * activation_derivative(kKind, z, parameter);
      }
    });
    return;
  }
  float v[kVector];  // the activation's input
  float d[kVector];  // its derivative there
#pragma unroll
  for (int i = 0; i < kVector; ++i) d[i] = v[i] = fmaf(y[i], terms(i).scale, terms(i).offset);
  derivative_each(op.activation, d, channel);
#pragma unroll
  for (int i = 0; i < kVector; ++i) {
    const ChannelTerms t = terms(i);
    slope[i] = slope_term(g[i], v[i]);
    g[i] = fmaf(t.scale, g[i] * d[i], fmaf(t.c2, y[i], t.c3));
  }
}

// Channels-last: a thread's run of channels, kRun (one 8-byte access of 16-bit elements,
// 16 bytes of float) where the channels and pointers allow, else one. Narrower than
// the ReLU op's 16-byte runs: the family's kernels hold four constants a channel.
constexpr int kRun = 4;

template <int kWidth, class T>
__device__ __forceinline__ void load_elements(const T* src, float* v) {
  if constexpr (kWidth == 1) {
    v[0] = to_float(*src);
  } else if constexpr (std::is_same_v<T, float>) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  } else {
    static_assert(kWidth * sizeof(T) == sizeof(uint2));
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) v[i] = to_float(elems[i]);
  }
}

template <int kWidth, class T>
__device__ __forceinline__ void store_elements(T* dst, const float* v) {
  if constexpr (kWidth == 1) {
    *dst = from_float<T>(v[0]);
  } else if constexpr (std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    uint2 raw;
    T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < kWidth; ++i) elems[i] = from_float<T>(v[i]);
    *reinterpret_cast<uint2*>(dst) = raw;
  }
}

// The kVector values a channels-last thread takes at once: its run of kWidth channels
// in each of kVector / kWidth rows `step` apart (value i: row i / kWidth, channel
// i % kWidth). Rows past the chunk are read as the first one again, and neither written
// nor summed.
template <int kWidth>
struct RowBatch {
  int64_t first;
  int64_t step;
  int64_t end;

  __device__ bool valid(int i) const { return first + (i / kWidth) * step < end; }
  __device__ int64_t element(int i, int64_t channels, int64_t c) const {
    return (valid(i) ? first + (i / kWidth) * step : first) * channels + c;
  }
  template <class T>
  __device__ void load(const T* src, int64_t channels, int64_t c, float (&v)[kVector]) const {
#pragma unroll
    for (int i = 0; i < kVector; i += kWidth) load_elements<kWidth>(src + element(i, channels, c), v + i);
  }
  template <class T>
  __device__ void store(T* dst, int64_t channels, int64_t c, const float (&v)[kVector]) const {
#pragma unroll
    for (int i = 0; i < kVector; i += kWidth) {
      if (valid(i)) store_elements<kWidth>(dst + element(i, channels, c), v + i);
    }
  }
};

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads, kSumsBlocksPerSm<T>)
    norm_activation_backward_sums_rows_kernel(const T* __restrict__ dy, const T* __restrict__ y, const Recompute<T> op,
                                              const GroupNormBackwardShape shape, float2* __restrict__ sums) {
  __shared__ float2 scratch[kThreads];
  const int64_t channels = shape.norm.channels;
  const ChunkLanes<kWidth> lanes(channels);
  const Chunk chunk(shape);
  for (int64_t c0 = 0; c0 < channels; c0 += lanes.channel_step()) {
    const int64_t c = c0 + int64_t{lanes.col} * kWidth;
    float2 s[kWidth] = {};
    if (lanes.row_lane < lanes.row_lanes && c < channels) {
      ChannelTerms t[kWidth];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) t[k] = channel_terms(op, chunk.n, c + k);
      const auto terms = [&](int i) { return t[i % kWidth]; };
      const auto channel = [&](int i) { return c + i % kWidth; };
      const int64_t step = int64_t{lanes.row_lanes} * (kVector / kWidth);
      for (int64_t r = chunk.row_begin + lanes.row_lane; r < chunk.row_end; r += step) {
        const RowBatch<kWidth> rows{r, lanes.row_lanes, chunk.row_end};
        float v[kVector], g[kVector];
        rows.load(y, channels, c, v);
        rows.load(dy, channels, c, g);
        norm_gradient(op, v, g, terms, channel);
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          if (!rows.valid(i)) continue;
          s[i % kWidth].x += g[i];
          s[i % kWidth].y = fmaf(g[i], v[i], s[i % kWidth].y);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float2 total = reduce_row_lanes(s[k], lanes, scratch, float2{0.f, 0.f});
      if (lanes.row_lane == 0 && c < channels) sums[chunk.slot(shape, c + k)] = complete_sums(op, c + k, total);
    }
  }
}

// dz may be dy itself (each element is read, then written, by the same thread), so those
// two pointers are not __restrict__.
template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads, kGradBlocksPerSm)
    norm_activation_backward_grad_rows_kernel(const T* dy, const T* __restrict__ y, const Recompute<T> op,
                                              const GroupNormBackwardShape shape, const GroupNormBackwardTerms terms,
                                              T* dz) {
  __shared__ float2 scratch[kThreads];
  const int64_t channels = shape.norm.channels;
  const ChunkLanes<kWidth> lanes(channels);
  const Chunk chunk(shape);
  const bool slopes = terms.slope_terms != nullptr;
  for (int64_t c0 = 0; c0 < channels; c0 += lanes.channel_step()) {
    const int64_t c = c0 + int64_t{lanes.col} * kWidth;
    float2 s[kWidth] = {};  // (sum dz, sum of slope terms)
    if (lanes.row_lane < lanes.row_lanes && c < channels) {
      ChannelTerms t[kWidth];
#pragma unroll
      for (int k = 0; k < kWidth; ++k) t[k] = grad_terms(op, terms.group_terms, chunk.n, c + k);
      const auto terms_of = [&](int i) { return t[i % kWidth]; };
      const auto channel = [&](int i) { return c + i % kWidth; };
      const int64_t step = int64_t{lanes.row_lanes} * (kVector / kWidth);
      for (int64_t r = chunk.row_begin + lanes.row_lane; r < chunk.row_end; r += step) {
        const RowBatch<kWidth> rows{r, lanes.row_lanes, chunk.row_end};
        float v[kVector], g[kVector], slope[kVector];
        rows.load(y, channels, c, v);
        rows.load(dy, channels, c, g);
        input_gradient(op, v, g, slope, terms_of, channel);
        rows.store(dz, channels, c, g);
#pragma unroll
        for (int i = 0; i < kVector; ++i) {
          if (!rows.valid(i)) continue;
          s[i % kWidth].x += g[i];
          if (slopes) s[i % kWidth].y += slope[i];
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float2 total = reduce_row_lanes(s[k], lanes, scratch, float2{0.f, 0.f});
      if (lanes.row_lane == 0 && c < channels) {
        terms.bias_terms[chunk.slot(shape, c + k)] = total.x;
        if (slopes) terms.slope_terms[chunk.slot(shape, c + k)] = total.y;
      }
    }
  }
}

// NCDHW: a block per (plane of a sample's channel, chunk of its pixels), grid (planes,
// chunks).
struct PlaneChunk {
  int64_t n;
  int64_t c;
  int64_t chunk;
  int64_t begin;  // pixels of the plane
  int64_t end;
  int64_t origin;  // the plane's first element

  __device__ explicit PlaneChunk(const GroupNormBackwardShape& s) {
    const int64_t plane = blockIdx.x;
    n = plane / s.norm.channels;
    c = plane - n * s.norm.channels;
    chunk = blockIdx.y;
    begin = chunk * s.rows_per_chunk;
    end = std::min(s.norm.spatial, begin + s.rows_per_chunk);
    origin = plane * s.norm.spatial;
  }
  __device__ int64_t slot(const GroupNormBackwardShape& s) const {
    return (n * s.chunks + chunk) * s.norm.channels + c;
  }
};

// The kVector pixels of a plane a thread takes at once: one 16-byte run from `first`
// (kVectorPixels: the chunks are whole runs), or kVector pixels kThreads apart, those
// past the chunk read as the first one again, and neither written nor summed.
template <bool kVectorPixels>
struct PlaneBatch {
  int64_t first;
  int64_t end;

  static constexpr int64_t kFirstStep = kVectorPixels ? kVector : 1;  // between threads' first pixels
  __device__ bool valid(int i) const { return kVectorPixels || first + int64_t{i} * kThreads < end; }
  __device__ int64_t pixel(int i) const { return valid(i) ? first + int64_t{i} * kThreads : first; }
  template <class T>
  __device__ void load(const T* plane, float (&v)[kVector]) const {
    if constexpr (kVectorPixels) {
      load_vector(plane + first, v);
    } else {
#pragma unroll
      for (int i = 0; i < kVector; ++i) v[i] = to_float(plane[pixel(i)]);
    }
  }
  template <class T>
  __device__ void store(T* plane, const float (&v)[kVector]) const {
    if constexpr (kVectorPixels) {
      store_vector(plane + first, v);
    } else {
#pragma unroll
      for (int i = 0; i < kVector; ++i) {
        if (valid(i)) plane[pixel(i)] = from_float<T>(v[i]);
      }
    }
  }
};

template <class T, bool kVectorPixels>
__global__ void __launch_bounds__(kThreads, kSumsBlocksPerSm<T>)
    norm_activation_backward_sums_planes_kernel(const T* __restrict__ dy, const T* __restrict__ y,
                                                const Recompute<T> op, const GroupNormBackwardShape shape,
                                                float2* __restrict__ sums) {
  using Batch = PlaneBatch<kVectorPixels>;
  __shared__ float2 scratch[kThreads];
  const PlaneChunk chunk(shape);
  const ChannelTerms t = channel_terms(op, chunk.n, chunk.c);
  const auto terms = [&](int) { return t; };
  const auto channel = [&](int) { return chunk.c; };
  float2 s{0.f, 0.f};
  for (int64_t p = chunk.begin + threadIdx.x * Batch::kFirstStep; p < chunk.end; p += int64_t{kThreads} * kVector) {
    const Batch batch{p, chunk.end};
    float v[kVector], g[kVector];
    batch.load(y + chunk.origin, v);
    batch.load(dy + chunk.origin, g);
    norm_gradient(op, v, g, terms, channel);
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      if (!batch.valid(i)) continue;
      s.x += g[i];
      s.y = fmaf(g[i], v[i], s.y);
    }
  }
  const float2 total = reduce_block(s, scratch);
  if (threadIdx.x == 0) sums[chunk.slot(shape)] = complete_sums(op, chunk.c, total);
}

// dz may be dy itself, as in the channels-last kernel.
template <class T, bool kVectorPixels>
__global__ void __launch_bounds__(kThreads, kGradBlocksPerSm)
    norm_activation_backward_grad_planes_kernel(const T* dy, const T* __restrict__ y, const Recompute<T> op,
                                                const GroupNormBackwardShape shape, const GroupNormBackwardTerms terms,
                                                T* dz) {
  using Batch = PlaneBatch<kVectorPixels>;
  __shared__ float2 scratch[kThreads];
  const PlaneChunk chunk(shape);
  const ChannelTerms t = grad_terms(op, terms.group_terms, chunk.n, chunk.c);
  const auto terms_of = [&](int) { return t; };
  const auto channel = [&](int) { return chunk.c; };
  const bool slopes = terms.slope_terms != nullptr;
  float2 s{0.f, 0.f};  // (sum dz, sum of slope terms)
  for (int64_t p = chunk.begin + threadIdx.x * Batch::kFirstStep; p < chunk.end; p += int64_t{kThreads} * kVector) {
    const Batch batch{p, chunk.end};
    float v[kVector], g[kVector], slope[kVector];
    batch.load(y + chunk.origin, v);
    batch.load(dy + chunk.origin, g);
    input_gradient(op, v, g, slope, terms_of, channel);
    batch.store(dz + chunk.origin, g);
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      if (!batch.valid(i)) continue;
      s.x += g[i];
      if (slopes) s.y += slope[i];
    }
  }
  const float2 total = reduce_block(s, scratch);
  if (threadIdx.x == 0) {
    terms.bias_terms[chunk.slot(shape)] = total.x;
    if (slopes) terms.slope_terms[chunk.slot(shape)] = total.y;
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

// Runs of `width` elements along a contiguous extent where it is a whole number of them
// and every pointer is `alignment`-byte aligned.
bool whole_runs(int64_t extent, int64_t width, uintptr_t alignment, std::initializer_list<const void*> pointers) {
  if (extent % width != 0) return false;
  return std::all_of(pointers.begin(), pointers.end(),
                     [&](const void* p) { return reinterpret_cast<uintptr_t>(p) % alignment == 0; });
}

// 16-byte runs along the contiguous extent (the channels channels-last, the pixels
// NCDHW) where it is a whole number of them and every pointer is 16-byte aligned.
bool vector_runs(int64_t extent, std::initializer_list<const void*> pointers) {
  return whole_runs(extent, kVector, sizeof(uint4), pointers);
}

}  // namespace

GroupNormBackwardShape GroupNormBackwardShape::plan(const GroupNormShape& norm, int sm_count) {
  // Eight blocks per SM in all, chunks of at least 64 pixels.
  const int64_t wanted = ceil_div(int64_t{8} * sm_count, std::max<int64_t>(norm.batch, 1));
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(ceil_div(norm.spatial, 64), 1));
  const int64_t rows = std::max<int64_t>(ceil_div(norm.spatial, chunks), 1);
  return {norm, rows, ceil_div(norm.spatial, rows)};
}

GroupNormBackwardShape GroupNormBackwardShape::plan_planes(const GroupNormShape& norm, int sm_count) {
  // Eight blocks per SM in all, chunks of at least one pass of a block's threads.
  constexpr int64_t kPass = int64_t{kThreads} * kVector;
  const int64_t wanted = ceil_div(int64_t{8} * sm_count, std::max<int64_t>(norm.batch * norm.channels, 1));
  const int64_t chunks = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(ceil_div(norm.spatial, kPass), 1));
  const int64_t rows = std::max<int64_t>(ceil_div(ceil_div(norm.spatial, chunks), int64_t{kVector}) * kVector, 1);
  return {norm, rows, ceil_div(norm.spatial, rows)};
}

namespace {

ShuffleIndex shuffle_index(const PixelShuffle& order) {
  return order.identity() ? ShuffleIndex() : ShuffleIndex(order);
}

}  // namespace

void relu_group_norm_backward_sums(ElementType element, const void* dy, const void* activation,
                                   const PixelShuffle& order, const GroupNormBackwardShape& shape,
                                   const GroupNormBackwardTerms& terms, cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const bool shuffled = !order.identity();
    const auto kernel =
        vector_runs(shape.norm.channels, {dy, activation})
            ? (shuffled ? backward_sums_kernel<T, kVector, true> : backward_sums_kernel<T, kVector, false>)
            : (shuffled ? backward_sums_kernel<T, 1, true> : backward_sums_kernel<T, 1, false>);
    kernel<<<chunk_grid(shape), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(activation),
                                                       shuffle_index(order), shape, terms.sums);
  });
  check_launch("backward_sums_kernel");
}

void group_norm_backward_coefficients(const GroupNormBackwardShape& shape, const float* mean, const float* rstd,
                                      const void* gamma, ElementType affine_element,
                                      const GroupNormBackwardTerms& terms, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(shape.norm.num_groups), static_cast<unsigned>(shape.norm.batch));
  backward_coefficients_kernel<<<grid, kThreads, 0, stream>>>(shape, mean, rstd, gamma, affine_element, terms);
  check_launch("backward_coefficients_kernel");
}

void relu_group_norm_backward_grad(ElementType element, const void* dy, const void* activation,
                                   const PixelShuffle& order, const GroupNormBackwardShape& shape,
                                   const GroupNormBackwardTerms& terms, void* grad_pre_activation,
                                   cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const bool shuffled = !order.identity();
    const auto kernel =
        vector_runs(shape.norm.channels, {dy, activation, grad_pre_activation})
            ? (shuffled ? backward_grad_kernel<T, kVector, true> : backward_grad_kernel<T, kVector, false>)
            : (shuffled ? backward_grad_kernel<T, 1, true> : backward_grad_kernel<T, 1, false>);
    kernel<<<chunk_grid(shape), kThreads, 0, stream>>>(static_cast<const T*>(dy), static_cast<const T*>(activation),
                                                       shuffle_index(order), shape, terms,
                                                       static_cast<T*>(grad_pre_activation));
  });
  check_launch("backward_grad_kernel");
}

void group_norm_backward_parameter_grads(const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                         const ParameterGradients& out, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(ceil_div(shape.norm.channels, int64_t{kParameterColumns}));
  parameter_grads_kernel<<<blocks, kThreads, 0, stream>>>(shape, terms, out);
  check_launch("parameter_grads_kernel");
}

namespace {

template <class T>
Recompute<T> recompute_of(const NormActivationBackward& op, const GroupNormShape& s) {
  return {static_cast<const T*>(op.bias), op.mean,     op.rstd, op.affine, op.activation, op.before_norm,
          s.channels / s.num_groups,      s.num_groups};
}

dim3 plane_grid(const GroupNormBackwardShape& s) {
  return dim3(static_cast<unsigned>(s.norm.batch * s.norm.channels), static_cast<unsigned>(s.chunks));
}

}  // namespace

void norm_activation_backward_sums(ElementType element, const void* dy, const void* y, const NormActivationBackward& op,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const Recompute<T> r = recompute_of<T>(op, shape.norm);
    const auto* dy_t = static_cast<const T*>(dy);
    const auto* y_t = static_cast<const T*>(y);
    if (op.layout == ActivationLayout::kChannelsLast) {
      const auto kernel = whole_runs(shape.norm.channels, kRun, kRun * sizeof(T), {dy, y})
                              ? norm_activation_backward_sums_rows_kernel<T, kRun>
                              : norm_activation_backward_sums_rows_kernel<T, 1>;
      kernel<<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, y_t, r, shape, terms.sums);
    } else {
      const auto kernel = vector_runs(shape.norm.spatial, {dy, y})
                              ? norm_activation_backward_sums_planes_kernel<T, true>
                              : norm_activation_backward_sums_planes_kernel<T, false>;
      kernel<<<plane_grid(shape), kThreads, 0, stream>>>(dy_t, y_t, r, shape, terms.sums);
    }
  });
  check_launch("norm_activation_backward_sums_kernel");
}

void norm_activation_backward_grad(ElementType element, const void* dy, const void* y, const NormActivationBackward& op,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms, void* dz,
                                   cudaStream_t stream) {
  with_type(element, [&](auto t) {
    using T = decltype(t);
    const Recompute<T> r = recompute_of<T>(op, shape.norm);
    const auto* dy_t = static_cast<const T*>(dy);
    const auto* y_t = static_cast<const T*>(y);
    auto* dz_t = static_cast<T*>(dz);
    if (op.layout == ActivationLayout::kChannelsLast) {
      const auto kernel = whole_runs(shape.norm.channels, kRun, kRun * sizeof(T), {dy, y, dz})
                              ? norm_activation_backward_grad_rows_kernel<T, kRun>
                              : norm_activation_backward_grad_rows_kernel<T, 1>;
      kernel<<<chunk_grid(shape), kThreads, 0, stream>>>(dy_t, y_t, r, shape, terms, dz_t);
    } else {
      const auto kernel = vector_runs(shape.norm.spatial, {dy, y, dz})
                              ? norm_activation_backward_grad_planes_kernel<T, true>
                              : norm_activation_backward_grad_planes_kernel<T, false>;
      kernel<<<plane_grid(shape), kThreads, 0, stream>>>(dy_t, y_t, r, shape, terms, dz_t);
    }
  });
  check_launch("norm_activation_backward_grad_kernel");
}

}  // namespace cutlassfuse
