// torch.ops.cutlassfuse.bias_add's CUDA kernel: this project's one-pass bias and residual
// add (cutlassfuse/common/bias_add.h) for packed NC... or channels-last tensors of 16-bit
// or float32 elements, ATen's adds for every other call. The output has the input's strides.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <optional>

#include "cutlassfuse/common/bias_add.h"
#include "dispatch/op_arguments.h"
#include "torch/bias_add.h"

namespace cutlassfuse {
namespace {

bool aligned_to_elements(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % t.element_size() == 0;
}

// The problem where the kernel takes the call: a packed CUDA tensor, NC... or channels-last;
// a bias of its type and channels on its device; a residual with its sizes, type and
// strides.
std::optional<BiasAdd> kernel_problem(const at::Tensor& input, const at::Tensor& bias,
                                      const std::optional<at::Tensor>& residual) {
  const std::optional<ElementType> element = element_type(input.scalar_type());
  if (!element || !input.is_cuda() || input.layout() != at::kStrided || input.dim() < 2 || input.numel() == 0 ||
      !aligned_to_elements(input))
    return std::nullopt;
  if (bias.dim() != 1 || bias.size(0) != input.size(1) || bias.scalar_type() != input.scalar_type() ||
      bias.device() != input.device() || bias.layout() != at::kStrided || !bias.is_contiguous() ||
      !aligned_to_elements(bias))
    return std::nullopt;
  if (residual && (residual->sizes() != input.sizes() || residual->strides() != input.strides() ||
                   residual->scalar_type() != input.scalar_type() || residual->device() != input.device() ||
                   residual->layout() != at::kStrided || !aligned_to_elements(*residual)))
    return std::nullopt;
  const at::MemoryFormat channels_last =
      input.dim() == 5 ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::ChannelsLast;
  BiasAdd p{input.numel(), input.size(1), 1, *element};
  if (input.is_contiguous()) {
    p.plane = input.dim() == 2 ? 1 : input.numel() / (input.size(0) * input.size(1));
  } else if (!((input.dim() == 4 || input.dim() == 5) && input.is_contiguous(channels_last))) {
    return std::nullopt;
  }
  if (!bias_add_takes(p)) return std::nullopt;
  return p;
}

}  // namespace

at::Tensor bias_add_cuda(const at::Tensor& input, const at::Tensor& bias, const std::optional<at::Tensor>& residual) {
  const std::optional<BiasAdd> p = kernel_problem(input, bias, residual);
  if (!p) return aten_bias_add(input, bias, residual);
  const c10::cuda::CUDAGuard device_guard(input.device());
  at::Tensor out = at::empty_strided(input.sizes(), input.strides(), input.options());
  bias_add(input.const_data_ptr(), bias.const_data_ptr(), residual ? residual->const_data_ptr() : nullptr,
           out.data_ptr(), *p, at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
