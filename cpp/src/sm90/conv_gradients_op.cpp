// The CUDA kernels of conv_transpose3d_input_grad / _weight_grad: this project's CUTLASS
// conv-gradient kernels (sm90/conv_gradients.h) on channels-last operands.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cutlassfuse/op.h"
#include "cutlassfuse/sm90/conv_gradients.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {
namespace {

enum class Gradient { kInput, kWeight };

// What one gradient's kernel reads, channels-last: dz and the filter (input gradient) or
// dz and the input (weight gradient).
struct GradientCall {
  Problem problem;
  MathMode math;
  at::Tensor dz, operand;
};

template <Gradient Of>
GradientCall gradient_call(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                           const ConvTransposeGeometry& g) {
  const Problem p = conv_transpose_problem(input, weight, g);
  const std::string why = sm90::conv_gradient_rejection(p);
  TORCH_CHECK_VALUE(why.empty(), "cutlassfuse: the CUTLASS conv-gradient kernels do not take this layer: ", why);
  TORCH_CHECK_VALUE(input.is_cuda() && at::cuda::getDeviceProperties(input.device().index())->major == 9,
                    "cutlassfuse: the CUTLASS conv-gradient kernels run on sm_90 GPUs only");
  const auto element = element_type(input.scalar_type());
  TORCH_CHECK_TYPE(element && *element != ElementType::kFloat32 && grad_output.scalar_type() == input.scalar_type() &&
                       weight.scalar_type() == input.scalar_type(),
                   "cutlassfuse: the CUTLASS conv-gradient kernels take float16 or bfloat16 tensors of one dtype");
  const auto last = at::MemoryFormat::ChannelsLast3d;
  const at::Tensor& operand = Of == Gradient::kInput ? weight : input;
  return {p, *tensor_core_math(*element, Float32Mode::kPyTorch), grad_output.contiguous(last),
          operand.contiguous(last)};
}

template <Gradient Of>
at::Tensor gradient(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                    const ConvTransposeGeometry& geometry) {
  const GradientCall c = gradient_call<Of>(grad_output, input, weight, geometry);
  const c10::cuda::CUDAGuard device_guard(input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  at::Tensor out = at::empty_like(Of == Gradient::kInput ? input : weight, at::MemoryFormat::ChannelsLast3d);
  with_math(c.math, [&](auto m) {
    constexpr MathMode math = decltype(m)::value;
    if constexpr (is_16_bit(math)) {
      if constexpr (Of == Gradient::kInput) {
        sm90::conv_transpose_input_gradient<math>(c.problem, c.dz.data_ptr(), c.operand.data_ptr(), out.data_ptr(),
                                                  sm_count, stream);
      } else {
        sm90::conv_transpose_weight_gradient<math>(c.problem, c.dz.data_ptr(), c.operand.data_ptr(), out.data_ptr(),
                                                   sm_count, stream);
      }
    }
  });
  return out;
}

}  // namespace

at::Tensor cutlass_conv_transpose3d_input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                               const at::Tensor& weight, const ConvTransposeGeometry& geometry) {
  return gradient<Gradient::kInput>(grad_output, input, weight, geometry);
}

at::Tensor cutlass_conv_transpose3d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                const at::Tensor& weight, const ConvTransposeGeometry& geometry) {
  return gradient<Gradient::kWeight>(grad_output, input, weight, geometry);
}

}  // namespace cutlassfuse
