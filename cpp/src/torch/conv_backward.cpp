#include "torch/conv_backward.h"

#include "cutlassfuse/op.h"
#include "cutlassfuse/settings.h"
#include "torch/redispatch.h"

#if CUTLASSFUSE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/sm90/conv_gradients.h"
#endif

namespace cutlassfuse {
namespace {

bool half_precision_cuda(const at::Tensor& dz) {
  return dz.is_cuda() && (dz.scalar_type() == at::kHalf || dz.scalar_type() == at::kBFloat16);
}

at::Tensor in_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  return convert_memory_format_op().call(t, format == at::MemoryFormat::ChannelsLast3d);
}

// Whether this project's CUTLASS conv-gradient kernels take the layer: asked for
// (backends flag), fp16/bf16 on an sm_90 GPU, within the kernels' rules.
bool cutlass_gradients_take(const at::Tensor& dz, const at::Tensor& input, const at::Tensor& weight,
                            const ConvTransposeGeometry& g) {
#if CUTLASSFUSE_WITH_CUDA
  if (!current_options().backend.cutlass_conv_gradients || !half_precision_cuda(dz)) return false;
  if (at::cuda::getDeviceProperties(dz.device().index())->major != 9) return false;
  return sm90::conv_gradient_rejection(conv_transpose_problem(input, weight, g)).empty();
#else
  return false;
#endif
}

}  // namespace

std::pair<at::Tensor, at::Tensor> conv_transpose3d_backward(at::Tensor dz, const at::Tensor& input,
                                                            const at::Tensor& weight, const ConvTransposeGeometry& g,
                                                            std::array<bool, 2> need) {
  const at::MemoryFormat input_format = input.suggest_memory_format();
  const bool channels_last = half_precision_cuda(dz);
  if (channels_last) dz = in_memory_format(dz, at::MemoryFormat::ChannelsLast3d);
  at::Tensor x = channels_last ? in_memory_format(input, at::MemoryFormat::ChannelsLast3d) : input;
  at::Tensor grad_input, grad_weight;
  if (cutlass_gradients_take(dz, x, weight, g)) {
    const auto call = [&](const auto& op) {
      return op.call(dz, x, weight, g.stride, g.padding, g.output_padding, g.groups, g.dilation);
    };
    if (need[1]) grad_weight = call(weight_grad_op());
    if (need[0]) grad_input = call(input_grad_op());
  } else {
    std::tie(grad_input, grad_weight, std::ignore) = at::convolution_backward_symint(
        dz, x, weight, std::nullopt, c10::fromIntArrayRefSlow(g.stride), c10::fromIntArrayRefSlow(g.padding),
        c10::fromIntArrayRefSlow(g.dilation), /*transposed=*/true, c10::fromIntArrayRefSlow(g.output_padding), g.groups,
        {need[0], need[1], false});
  }
  dz.reset();
  x.reset();
  if (grad_input.defined()) grad_input = in_memory_format(grad_input, input_format);
  // The filter's gradient is small; it takes the filter's layout as autograd would.
  if (grad_weight.defined()) grad_weight = grad_weight.contiguous(weight.suggest_memory_format());
  return {grad_input, grad_weight};
}

}  // namespace cutlassfuse
