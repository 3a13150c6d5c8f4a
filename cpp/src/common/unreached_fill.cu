// Writes ReLU(bias) at the output pixels no input reaches. See cutlassfuse/common/unreached_fill.h.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/unreached_fill.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;

// One dimension of the deconvolution: output o is reached when some tap t puts an
// input i = (o + padding - t * dilation) / stride there, exactly and inside the input.
struct ReachRule {
  int input, kernel, stride, padding, dilation;

  __device__ bool reached(int o) const {
    for (int t = 0; t < kernel; ++t) {
      const int r = o + padding - t * dilation;
      if (r >= 0 && r % stride == 0 && r / stride < input) return true;
    }
    return false;
  }
};

struct ReachRules {
  ReachRule dims[3];
  int extent[3];  // Do, Ho, Wo
};

// A thread per (pixel, vector of 8 channels); only unreached pixels are written.
template <class T>
__global__ void __launch_bounds__(kThreads)
fill_unreached_kernel(T* __restrict__ activation, const T* __restrict__ bias, ReachRules rules, int64_t pixels,
                      int channels) {
  const int vectors = channels / kVector;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < pixels * vectors;
       i += int64_t{gridDim.x} * kThreads) {
    const int64_t pixel = i / vectors;
    const int w = static_cast<int>(pixel % rules.extent[2]);
    const int h = static_cast<int>(pixel / rules.extent[2] % rules.extent[1]);
    const int d = static_cast<int>(pixel / (int64_t{rules.extent[2]} * rules.extent[1]) % rules.extent[0]);
    if (rules.dims[0].reached(d) && rules.dims[1].reached(h) && rules.dims[2].reached(w)) continue;
    const int c0 = static_cast<int>(i % vectors) * kVector;
    float v[kVector];
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = bias == nullptr ? 0.f : relu(to_float(bias[c0 + k]));
    store_vector(activation + pixel * channels + c0, v);
  }
}

template <class T>
void launch(void* activation, const void* bias, const Problem& p, cudaStream_t stream) {
  ReachRules rules{};
  for (int i = 0; i < 3; ++i) {
    rules.dims[i] = {static_cast<int>(p.input_size[i]), static_cast<int>(p.kernel_size[i]),
                     static_cast<int>(p.stride[i]), static_cast<int>(p.padding[i]), static_cast<int>(p.dilation[i])};
    rules.extent[i] = static_cast<int>(p.output_size[i]);
  }
  const int64_t pixels = p.batch * p.output_spatial();
  const int64_t work = pixels * (p.out_channels / kVector);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(work, kThreads), int64_t{1} << 16));
  fill_unreached_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(activation), static_cast<const T*>(bias),
                                                            rules, pixels, static_cast<int>(p.out_channels));
  check_launch("fill_unreached_kernel");
}

}  // namespace

void fill_unreached_pixels(ElementType element, void* activation, const void* bias, const Problem& problem,
                           cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16: return launch<__half>(activation, bias, problem, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(activation, bias, problem, stream);
    case ElementType::kFloat32: return launch<float>(activation, bias, problem, stream);
  }
}

}  // namespace cutlassfuse
