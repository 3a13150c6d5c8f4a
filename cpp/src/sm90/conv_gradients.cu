// The gradients of ConvTranspose3d on sm90 tensor cores (conv_gradients.h), float16 and
// bfloat16, in one translation unit (docs/architecture.md, "The build"):
// - the input gradient: the forward convolution of dz with the filter;
// - the weight gradient: the filter gradient of the forward convolution of dz, x as its
//   output gradient.
#include "cutlassfuse/sm90/conv_gradient_kernels.cuh"
#include "cutlassfuse/sm90/conv_gradients.h"

namespace cutlassfuse::sm90 {

template <>
void conv_transpose_input_gradient<MathMode::kFloat16>(const Problem& p, const void* dz, const void* filter, void* dx,
                                                       int sm_count, cudaStream_t stream) {
  run_conv_gradient<cutlass::conv::Operator::kFprop, cutlass::half_t>(p, dz, filter, dx, sm_count, stream);
}

template <>
void conv_transpose_input_gradient<MathMode::kBFloat16>(const Problem& p, const void* dz, const void* filter, void* dx,
                                                        int sm_count, cudaStream_t stream) {
  run_conv_gradient<cutlass::conv::Operator::kFprop, cutlass::bfloat16_t>(p, dz, filter, dx, sm_count, stream);
}

template <>
void conv_transpose_weight_gradient<MathMode::kFloat16>(const Problem& p, const void* dz, const void* x, void* dw,
                                                        int sm_count, cudaStream_t stream) {
  run_conv_gradient<cutlass::conv::Operator::kWgrad, cutlass::half_t>(p, x, dz, dw, sm_count, stream);
}

template <>
void conv_transpose_weight_gradient<MathMode::kBFloat16>(const Problem& p, const void* dz, const void* x, void* dw,
                                                         int sm_count, cudaStream_t stream) {
  run_conv_gradient<cutlass::conv::Operator::kWgrad, cutlass::bfloat16_t>(p, x, dz, dw, sm_count, stream);
}

}  // namespace cutlassfuse::sm90
