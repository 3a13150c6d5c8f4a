#include "torch/conv_backward.h"

#include "torch/redispatch.h"

namespace cutlassfuse {
namespace {

bool channels_last_operands(const at::Tensor& dz) {
  return dz.is_cuda() && (dz.scalar_type() == at::kHalf || dz.scalar_type() == at::kBFloat16);
}

at::Tensor in_memory_format(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  return convert_memory_format_op().call(t, format == at::MemoryFormat::ChannelsLast3d);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> conv_transpose3d_backward(at::Tensor dz, const at::Tensor& input,
                                                            const at::Tensor& weight, const ConvTransposeShape& s,
                                                            std::array<bool, 2> need) {
  const bool channels_last = channels_last_operands(dz);
  const at::MemoryFormat input_format = input.suggest_memory_format();
  if (channels_last) dz = in_memory_format(dz, at::MemoryFormat::ChannelsLast3d);
  at::Tensor x = channels_last ? in_memory_format(input, at::MemoryFormat::ChannelsLast3d) : input;
  auto [grad_input, grad_weight, unused] = at::convolution_backward_symint(
      dz, x, weight, std::nullopt, c10::fromIntArrayRefSlow(s.stride), c10::fromIntArrayRefSlow(s.padding),
      c10::fromIntArrayRefSlow(s.dilation), /*transposed=*/true, c10::fromIntArrayRefSlow(s.output_padding), s.groups,
      {need[0], need[1], false});
  dz.reset();
  x.reset();
  if (grad_input.defined()) grad_input = in_memory_format(grad_input, input_format);
  // The filter's gradient is small; it takes the filter's layout as autograd would.
  if (grad_weight.defined()) grad_weight = grad_weight.contiguous(weight.suggest_memory_format());
  return {grad_input, grad_weight};
}

}  // namespace cutlassfuse
