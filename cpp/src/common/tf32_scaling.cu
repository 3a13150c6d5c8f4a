// The operands' magnitudes and the filter's scaling for float32 at TF32's precision on
// float16 tensor cores. See cutlassfuse/common/tf32_scaling.h.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/tf32_scaling.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // per tensor: enough to fill the GPU, one atomic each

__device__ __forceinline__ float finite_magnitude(float v) { return isfinite(v) ? fabsf(v) : 0.f; }

// Block (x, tensor): tensor 0 is the input, 1 the filter. 16-byte loads where the data
// is aligned (the loads' tail and unaligned data element by element); a block's maximum
// goes to the tensor's slot by one atomicMax on its bits.
__global__ void __launch_bounds__(kThreads)
abs_max_kernel(const float* __restrict__ input, int64_t input_numel, const float* __restrict__ filter,
               int64_t filter_numel, uint32_t* __restrict__ max_bits) {
  const float* src = blockIdx.y == 0 ? input : filter;
  const int64_t numel = blockIdx.y == 0 ? input_numel : filter_numel;
  const int64_t first = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  const int64_t step = int64_t{gridDim.x} * kThreads;
  float m = 0.f;
  int64_t vectors = 0;
  if (reinterpret_cast<uintptr_t>(src) % sizeof(float4) == 0) {
    vectors = numel / 4;
    for (int64_t i = first; i < vectors; i += step) {
      const float4 v = reinterpret_cast<const float4*>(src)[i];
      m = fmaxf(fmaxf(m, finite_magnitude(v.x)), fmaxf(finite_magnitude(v.y), finite_magnitude(v.z)));
      m = fmaxf(m, finite_magnitude(v.w));
    }
  }
  for (int64_t i = vectors * 4 + first; i < numel; i += step) m = fmaxf(m, finite_magnitude(src[i]));
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  __shared__ float warp_max[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (float w : warp_max) m = fmaxf(m, w);
    atomicMax(max_bits + blockIdx.y, __float_as_uint(m));
  }
}

__global__ void __launch_bounds__(kThreads)
scale_filter_kernel(const float* __restrict__ filter, int64_t numel, Tf32OperandScales* scales,
                    __half* __restrict__ dst) {
  const Tf32ScaleExponents e = tf32_scale_exponents(scales->input_max_bits, scales->filter_max_bits);
  const PowerOfTwo scale(e.filter);
  if (blockIdx.x == 0 && threadIdx.x == 0) scales->descale = ldexpf(1.f, -(e.input + e.filter));
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < numel; i += int64_t{gridDim.x} * kThreads) {
    dst[i] = __float2half_rn(scale.times(filter[i]));
  }
}

unsigned blocks_for(int64_t elements, int64_t per_block) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(elements, per_block), 1, kMaxBlocks));
}

}  // namespace

void measure_tf32_operands(const void* input, int64_t input_numel, const void* filter, int64_t filter_numel,
                           Tf32OperandScales* scales, cudaStream_t stream) {
  if (const cudaError_t e = cudaMemsetAsync(scales, 0, sizeof(Tf32OperandScales), stream); e != cudaSuccess)
    throw std::runtime_error(std::string("cutlassfuse: zeroing the TF32 scales: ") + cudaGetErrorString(e));
  const dim3 grid(blocks_for(std::max(input_numel, filter_numel), int64_t{kThreads} * 4), 2);
  abs_max_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(input), input_numel,
                                                static_cast<const float*>(filter), filter_numel,
                                                &scales->input_max_bits);
  check_launch("abs_max_kernel");
}

void scale_filter_tf32(const void* filter, int64_t numel, Tf32OperandScales* scales, void* dst, cudaStream_t stream) {
  scale_filter_kernel<<<blocks_for(numel, kThreads), kThreads, 0, stream>>>(static_cast<const float*>(filter), numel,
                                                                            scales, static_cast<__half*>(dst));
  check_launch("scale_filter_kernel");
}

}  // namespace cutlassfuse
