// The input gradient of ConvTranspose3d on sm90 tensor cores (conv_gradients.h): the
// forward convolution of dz with the filter.
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

}  // namespace cutlassfuse::sm90
