// The upsampled modulation's pass. See cutlassfuse/common/upsampled_modulation.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>

#include "common/gather_copy.cuh"
#include "common/nearest_grid.cuh"
#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/upsampled_modulation.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;

// Grid-stride over the output's vectors of kVector channels: the input's vector, the
// scale's and the shift's of the source pixel (L2 hits: the small tensors), one fma and
// the activation in float32, one rounding.
template <class T>
__global__ void __launch_bounds__(kThreads)
upsampled_modulation_kernel(const T* __restrict__ input, const T* __restrict__ scale, const T* __restrict__ shift,
                            T* __restrict__ out, const NearestGrid grid, const FastDivisor pixel_vectors,
                            uint32_t vectors_per_pixel, uint32_t total_vectors, ActivationConstant activation) {
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t v = blockIdx.x * kThreads + threadIdx.x; v < total_vectors; v += stride) {
    const uint32_t pixel = pixel_vectors.quotient(v);
    const uint64_t source = static_cast<uint64_t>(gather_copy::source_pixel(grid, pixel)) * vectors_per_pixel +
                            pixel_vectors.remainder(v, pixel);
    float x[kVector], s[kVector], b[kVector];
    load_vector(input + static_cast<uint64_t>(v) * kVector, x);
    load_vector(scale + source * kVector, s);
    load_vector(shift + source * kVector, b);
#pragma unroll
    for (int i = 0; i < kVector; ++i) x[i] = activate(activation.kind, fmaf(x[i], s[i], b[i]), activation.parameter);
    store_vector(out + static_cast<uint64_t>(v) * kVector, x);
  }
}

template <class T>
void launch(const void* input, const void* scale, const void* shift, void* out, const UpsampledModulation& p,
            cudaStream_t stream) {
  const auto vectors_per_pixel = static_cast<uint32_t>(p.grid.channels / kVector);
  const auto total = static_cast<uint32_t>(p.grid.output_elements() / kVector);
  upsampled_modulation_kernel<T><<<gather_copy::blocks_for(total), kThreads, 0, stream>>>(
      static_cast<const T*>(input), static_cast<const T*>(scale), static_cast<const T*>(shift), static_cast<T*>(out),
      NearestGrid(p.grid), FastDivisor(vectors_per_pixel), vectors_per_pixel, total, p.activation);
  check_launch("upsampled_modulation_kernel");
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t bytes_of(ElementType element) { return element == ElementType::kFloat32 ? 4 : 2; }

}  // namespace

bool upsampled_modulation_takes(const UpsampledModulation& p) {
  return p.grid.channels % kVector == 0 && p.activation.kind != ActivationKind::kPReLU &&
         upsample_nearest3d_takes(p.grid, bytes_of(p.element));
}

void upsampled_modulation(const void* input, const void* scale, const void* shift, void* out,
                          const UpsampledModulation& p, cudaStream_t stream) {
  if (!upsampled_modulation_takes(p) || !aligned(input) || !aligned(scale) || !aligned(shift) || !aligned(out))
    throw std::invalid_argument(
        "cutlassfuse: upsampled_modulation takes channels-last tensors of up to 2^31 - 1 elements, channels a "
        "multiple of 8, pointers aligned to 16 bytes, an activation other than PReLU");
  switch (p.element) {
    case ElementType::kFloat16: return launch<__half>(input, scale, shift, out, p, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(input, scale, shift, out, p, stream);
    default: return launch<float>(input, scale, shift, out, p, stream);
  }
}

}  // namespace cutlassfuse
