// The direct convolution of few channels. See cutlassfuse/direct_conv/direct_conv3d.h.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/direct_conv/direct_conv3d.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
// Consecutive output pixels along W per thread: each filter value read from shared
// memory serves all of them, and their input pixels overlap at stride 1.
constexpr int kPixelsPerThread = 4;

// The sums of one input row (fixed depth and height taps) for a thread's pixels, the
// taps along W given at compile time at stride and dilation 1: the row's kPixelsPerThread
// + kTapsW - 1 input values are loaded once per channel, without bounds checks away from
// the row's ends, and every multiply-add is unrolled.
template <class T, int kOut, int kTapsW>
__device__ __forceinline__ void accumulate_row(const T* row, const float* row_filter, int ow0, int taps,
                                               const DirectConv3dProblem& p, float (&sum)[kPixelsPerThread][kOut]) {
  constexpr int kSpan = kPixelsPerThread + kTapsW - 1;
  const int iw0 = ow0 - p.padding[2];
  const bool interior = iw0 >= 0 && iw0 + kSpan <= p.input_size[2];
  const int64_t pixel_stride = p.input_strides[4];
  for (int ci = 0; ci < p.in_channels; ++ci) {
    const T* channel = row + ci * p.input_strides[1];
    float v[kSpan];
    if (interior) {
#pragma unroll
      for (int t = 0; t < kSpan; ++t) v[t] = to_float(channel[(iw0 + t) * pixel_stride]);
    } else {
#pragma unroll
      for (int t = 0; t < kSpan; ++t) {
        const int iw = iw0 + t;
        v[t] = iw >= 0 && iw < p.input_size[2] ? to_float(channel[iw * pixel_stride]) : 0.f;
      }
    }
    const float* f = row_filter + ci * taps * kOut;
#pragma unroll
    for (int kw = 0; kw < kTapsW; ++kw) {
#pragma unroll
      for (int co = 0; co < kOut; ++co) {
        const float w = f[kw * kOut + co];
#pragma unroll
        for (int j = 0; j < kPixelsPerThread; ++j) sum[j][co] = fmaf(v[kw + j], w, sum[j][co]);
      }
    }
  }
}

// The same sums for any taps, stride and dilation along W: each tap loads its values.
template <class T, int kOut>
__device__ __forceinline__ void accumulate_taps(const T* row, const float* row_filter, int ow0, int taps,
                                                const DirectConv3dProblem& p, float (&sum)[kPixelsPerThread][kOut]) {
  for (int kw = 0; kw < p.kernel_size[2]; ++kw) {
    int64_t offset[kPixelsPerThread];
    bool inside[kPixelsPerThread];
#pragma unroll
    for (int j = 0; j < kPixelsPerThread; ++j) {
      const int iw = (ow0 + j) * p.stride[2] - p.padding[2] + kw * p.dilation[2];
      inside[j] = ow0 + j < p.output_size[2] && iw >= 0 && iw < p.input_size[2];
      offset[j] = iw * p.input_strides[4];
    }
    for (int ci = 0; ci < p.in_channels; ++ci) {
      const float* f = row_filter + (ci * taps + kw) * kOut;
      float v[kPixelsPerThread];
#pragma unroll
      for (int j = 0; j < kPixelsPerThread; ++j) {
        v[j] = inside[j] ? to_float(row[offset[j] + ci * p.input_strides[1]]) : 0.f;
      }
#pragma unroll
      for (int co = 0; co < kOut; ++co) {
        const float w = f[co];
#pragma unroll
        for (int j = 0; j < kPixelsPerThread; ++j) sum[j][co] = fmaf(v[j], w, sum[j][co]);
      }
    }
  }
}

// A thread per kPixelsPerThread output pixels along W, consecutive threads along W
// (coalesced in NCDHW, contiguous pixels in NDHWC). kOut: the output channels rounded up
// to 1, 2, 4 or 8, the filter in shared memory padded with zero filters to kOut, so
// that the multiply-adds are unrolled and unpredicated and few are wasted. kTapsW: the
// filter's taps along W where they are 3 at stride and dilation 1 along W (accumulate_row),
// 0 for any other (accumulate_taps).
template <class T, int kOut, int kTapsW>
__global__ void __launch_bounds__(kThreads)
direct_conv3d_kernel(const T* __restrict__ input, const T* __restrict__ weight, const T* __restrict__ bias,
                     T* __restrict__ out, DirectConv3dProblem p) {
  extern __shared__ float filter[];  // [ci][tap][kOut]
  const int taps = p.kernel_size[0] * p.kernel_size[1] * p.kernel_size[2];
  for (int i = threadIdx.x; i < p.in_channels * taps * kOut; i += kThreads) {
    const int co = i % kOut, tap = i / kOut % taps, ci = i / (kOut * taps);
    const int kw = tap % p.kernel_size[2], kh = tap / p.kernel_size[2] % p.kernel_size[1],
              kd = tap / (p.kernel_size[2] * p.kernel_size[1]);
    filter[i] = co < p.out_channels
                    ? to_float(weight[co * p.weight_strides[0] + ci * p.weight_strides[1] + kd * p.weight_strides[2] +
                                      kh * p.weight_strides[3] + kw * p.weight_strides[4]])
                    : 0.f;
  }
  __syncthreads();

  // 32-bit index arithmetic: the host checks that the work items fit.
  const unsigned groups_w = (p.output_size[2] + kPixelsPerThread - 1) / kPixelsPerThread;
  const unsigned items = static_cast<unsigned>(p.batch) * p.output_size[0] * p.output_size[1] * groups_w;
  for (unsigned item = blockIdx.x * kThreads + threadIdx.x; item < items; item += gridDim.x * kThreads) {
    const int ow0 = static_cast<int>(item % groups_w) * kPixelsPerThread;
    unsigned rest = item / groups_w;
    const int oh = static_cast<int>(rest % p.output_size[1]);
    rest /= p.output_size[1];
    const int od = static_cast<int>(rest % p.output_size[0]);
    const int n = static_cast<int>(rest / p.output_size[0]);

    float sum[kPixelsPerThread][kOut];
#pragma unroll
    for (int co = 0; co < kOut; ++co) {
      const float b = bias != nullptr && co < p.out_channels ? to_float(bias[co]) : 0.f;
#pragma unroll
      for (int j = 0; j < kPixelsPerThread; ++j) sum[j][co] = b;
    }
    const T* sample = input + n * p.input_strides[0];
    for (int kd = 0; kd < p.kernel_size[0]; ++kd) {
      const int id = od * p.stride[0] - p.padding[0] + kd * p.dilation[0];
      if (id < 0 || id >= p.input_size[0]) continue;
      for (int kh = 0; kh < p.kernel_size[1]; ++kh) {
        const int ih = oh * p.stride[1] - p.padding[1] + kh * p.dilation[1];
        if (ih < 0 || ih >= p.input_size[1]) continue;
        const T* row = sample + id * p.input_strides[2] + ih * p.input_strides[3];
        const float* row_filter = filter + (kd * p.kernel_size[1] + kh) * p.kernel_size[2] * kOut;
        if constexpr (kTapsW > 0) {
          accumulate_row<T, kOut, kTapsW>(row, row_filter, ow0, taps, p, sum);
        } else {
          accumulate_taps<T, kOut>(row, row_filter, ow0, taps, p, sum);
        }
      }
    }
    T* o = out + n * p.output_strides[0] + od * p.output_strides[2] + oh * p.output_strides[3];
#pragma unroll
    for (int j = 0; j < kPixelsPerThread; ++j) {
      if (ow0 + j >= p.output_size[2]) break;
#pragma unroll
      for (int co = 0; co < kOut; ++co) {
        if (co < p.out_channels)
          o[(ow0 + j) * p.output_strides[4] + co * p.output_strides[1]] = from_float<T>(sum[j][co]);
      }
    }
  }
}

template <class T, int kOut, int kTapsW>
void launch(const void* input, const void* weight, const void* bias, void* out, const DirectConv3dProblem& p,
            int sm_count, cudaStream_t stream) {
  const int64_t items = direct_conv3d_work_items(p);
  if (items == 0) return;
  const int64_t filter_bytes = int64_t{p.in_channels} * p.kernel_size[0] * p.kernel_size[1] * p.kernel_size[2] * kOut *
                               static_cast<int64_t>(sizeof(float));
  // Enough resident blocks to hide the loads' latency; each block loads the filter once.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(items, kThreads), int64_t{sm_count} * 8));
  direct_conv3d_kernel<T, kOut, kTapsW><<<blocks, kThreads, static_cast<size_t>(filter_bytes), stream>>>(
      static_cast<const T*>(input), static_cast<const T*>(weight), static_cast<const T*>(bias), static_cast<T*>(out),
      p);
  check_launch("direct_conv3d_kernel");
}

template <class T, int kOut>
void launch_for_taps(const void* input, const void* weight, const void* bias, void* out, const DirectConv3dProblem& p,
                     int sm_count, cudaStream_t stream) {
  if (p.kernel_size[2] == 3 && p.stride[2] == 1 && p.dilation[2] == 1)
    return launch<T, kOut, 3>(input, weight, bias, out, p, sm_count, stream);
  return launch<T, kOut, 0>(input, weight, bias, out, p, sm_count, stream);
}

template <class T>
void launch_for_channels(const void* input, const void* weight, const void* bias, void* out,
                         const DirectConv3dProblem& p, int sm_count, cudaStream_t stream) {
  if (p.out_channels <= 1) return launch_for_taps<T, 1>(input, weight, bias, out, p, sm_count, stream);
  if (p.out_channels <= 2) return launch_for_taps<T, 2>(input, weight, bias, out, p, sm_count, stream);
  if (p.out_channels <= 4) return launch_for_taps<T, 4>(input, weight, bias, out, p, sm_count, stream);
  return launch_for_taps<T, 8>(input, weight, bias, out, p, sm_count, stream);
}

}  // namespace

int64_t direct_conv3d_work_items(const DirectConv3dProblem& p) {
  return int64_t{p.batch} * p.output_size[0] * p.output_size[1] * ceil_div(p.output_size[2], kPixelsPerThread);
}

void direct_conv3d(ElementType element, const void* input, const void* weight, const void* bias, void* out,
                   const DirectConv3dProblem& problem, int sm_count, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16: return launch_for_channels<__half>(input, weight, bias, out, problem, sm_count, stream);
    case ElementType::kBFloat16:
      return launch_for_channels<__nv_bfloat16>(input, weight, bias, out, problem, sm_count, stream);
    case ElementType::kFloat32: return launch_for_channels<float>(input, weight, bias, out, problem, sm_count, stream);
  }
}

}  // namespace cutlassfuse
