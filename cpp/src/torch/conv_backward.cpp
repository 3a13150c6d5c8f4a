#include "torch/conv_backward.h"

#include <algorithm>

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

// Which of the two gradients this project's CUTLASS kernels compute (the others: ATen):
// fp16/bf16 on an sm_90 GPU, within the kernels' rules, as cutlassfuse.backends'
// conv_gradients says (by default where the measured rule prefers them).
struct CutlassGradients {
  bool input = false;
  bool weight = false;
};

bool has_symbolic_sizes(const at::Tensor& t) {
  const auto sizes = t.sym_sizes();
  return std::any_of(sizes.begin(), sizes.end(), [](const c10::SymInt& s) { return !s.maybe_as_int().has_value(); });
}

CutlassGradients cutlass_gradients(const at::Tensor& dz, const at::Tensor& input, const at::Tensor& weight,
                                   const ConvTransposeGeometry& g) {
#if CUTLASSFUSE_WITH_CUDA
  const ConvGradients choice = current_options().backend.conv_gradients;
  if (choice == ConvGradients::kAten || !half_precision_cuda(dz)) return {};
  // Traced with symbolic sizes (torch.compile's dynamic shapes), the choice would guard
  // on them and specialize the graph: ATen's op takes every size.
  if (has_symbolic_sizes(dz) || has_symbolic_sizes(input)) return {};
  if (at::cuda::getDeviceProperties(dz.device().index())->major != 9) return {};
  const Problem p = conv_transpose_problem(input, weight, g);
  if (!sm90::conv_gradient_rejection(p).empty()) return {};
  if (choice == ConvGradients::kCutlass) return {true, true};
  return {sm90::input_gradient_preferred(p), sm90::weight_gradient_preferred(p)};
#else
  return {};
#endif
}

}  // namespace

std::pair<at::Tensor, at::Tensor> convolution_backward(at::Tensor dz, const at::Tensor& input, const at::Tensor& weight,
                                                       const ConvTransposeGeometry& g, bool transposed,
                                                       std::array<bool, 2> need, bool cutlass_kernels) {
  const at::MemoryFormat input_format = input.suggest_memory_format();
  const bool channels_last = half_precision_cuda(dz);
  if (channels_last) dz = in_memory_format(dz, at::MemoryFormat::ChannelsLast3d);
  at::Tensor x = channels_last ? in_memory_format(input, at::MemoryFormat::ChannelsLast3d) : input;
  const CutlassGradients cutlass =
      cutlass_kernels && transposed ? cutlass_gradients(dz, x, weight, g) : CutlassGradients{};
  const bool aten_input = need[0] && !cutlass.input, aten_weight = need[1] && !cutlass.weight;
  at::Tensor grad_input, grad_weight;
  if (aten_input || aten_weight) {
    std::tie(grad_input, grad_weight, std::ignore) = at::convolution_backward_symint(
        dz, x, weight, std::nullopt, c10::fromIntArrayRefSlow(g.stride), c10::fromIntArrayRefSlow(g.padding),
        c10::fromIntArrayRefSlow(g.dilation), transposed, c10::fromIntArrayRefSlow(g.output_padding), g.groups,
        {aten_input, aten_weight, false});
  }
  const auto call = [&](const auto& op) {
    return op.call(dz, x, weight, g.stride, g.padding, g.output_padding, g.groups, g.dilation);
  };
  if (need[1] && cutlass.weight) grad_weight = call(weight_grad_op());
  if (need[0] && cutlass.input) grad_input = call(input_grad_op());
  dz.reset();
  x.reset();
  if (grad_input.defined()) grad_input = in_memory_format(grad_input, input_format);
  // The filter's gradient is small; it takes the filter's layout as autograd would.
  if (grad_weight.defined()) grad_weight = grad_weight.contiguous(weight.suggest_memory_format());
  return {grad_input, grad_weight};
}

}  // namespace cutlassfuse
