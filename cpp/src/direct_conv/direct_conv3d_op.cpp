// torch.ops.cutlassfuse.direct_conv3d's CUDA kernel: the direct convolution of few
// channels (cutlassfuse/direct_conv/direct_conv3d.h) where it takes the call, ATen's
// convolution for every other call (which also raises PyTorch's errors on invalid
// arguments). The output has the layout ATen's convolution gives it.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <limits>

#include "cutlassfuse/direct_conv/direct_conv3d.h"
#include "dispatch/op_arguments.h"
#include "torch/direct_conv.h"

namespace cutlassfuse {
namespace {

bool fits_int(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

// Whether the direct kernel takes the call: CUDA tensors of one float type on one
// device, up to 8 channels in and out, the filter within shared memory, positive
// strides and dilations, non-negative padding, a non-empty output, every size an int.
bool direct_kernel_takes(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                         at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  if (!input.is_cuda() || input.dim() != 5 || weight.dim() != 5 || !element_type(input.scalar_type())) return false;
  if (stride.size() != 3 || padding.size() != 3 || dilation.size() != 3) return false;
  if (weight.device() != input.device() || weight.scalar_type() != input.scalar_type()) return false;
  if (present(bias) && (bias->device() != input.device() || bias->scalar_type() != input.scalar_type() ||
                        bias->dim() != 1 || bias->size(0) != weight.size(0)))
    return false;
  const int64_t in_channels = input.size(1), out_channels = weight.size(0);
  if (weight.size(1) != in_channels || in_channels < 1 || in_channels > kDirectConvMaxChannels || out_channels < 1 ||
      out_channels > kDirectConvMaxChannels)
    return false;
  if (out_channels * in_channels * weight.size(2) * weight.size(3) * weight.size(4) * int64_t{sizeof(float)} >
      kDirectConvMaxFilterBytes)
    return false;
  if (!fits_int(input.size(0)) || input.numel() == 0) return false;
  for (int i = 0; i < 3; ++i) {
    if (stride[i] < 1 || dilation[i] < 1 || padding[i] < 0 || !fits_int(input.size(2 + i)) ||
        !fits_int(weight.size(2 + i)) || !fits_int(padding[i]) || !fits_int(stride[i]) || !fits_int(dilation[i]))
      return false;
    const int64_t extent =
        conv_output_extent(input.size(2 + i), weight.size(2 + i), stride[i], padding[i], dilation[i]);
    if (extent < 1 || !fits_int(extent)) return false;
  }
  return true;
}

Strides5 strides_of(const at::Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3), t.stride(4)}; }

}  // namespace

at::Tensor direct_conv3d_cuda(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation) {
  if (!direct_kernel_takes(input, weight, bias, stride, padding, dilation)) {
    return at::conv3d(input, weight, bias, stride, padding, dilation, 1);
  }
  const c10::cuda::CUDAGuard device_guard(input.device());
  DirectConv3dProblem p{};
  p.batch = static_cast<int>(input.size(0));
  p.in_channels = static_cast<int>(input.size(1));
  p.out_channels = static_cast<int>(weight.size(0));
  std::vector<int64_t> size{input.size(0), weight.size(0)};
  for (int i = 0; i < 3; ++i) {
    p.input_size[i] = static_cast<int>(input.size(2 + i));
    p.kernel_size[i] = static_cast<int>(weight.size(2 + i));
    p.stride[i] = static_cast<int>(stride[i]);
    p.padding[i] = static_cast<int>(padding[i]);
    p.dilation[i] = static_cast<int>(dilation[i]);
    p.output_size[i] =
        static_cast<int>(conv_output_extent(input.size(2 + i), weight.size(2 + i), stride[i], padding[i], dilation[i]));
    size.push_back(p.output_size[i]);
  }
  if (!fits_int(direct_conv3d_work_items(p))) return at::conv3d(input, weight, bias, stride, padding, dilation, 1);
  // ATen's convolution gives channels_last_3d output where the input or the weight is.
  const bool channels_last = input.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d ||
                             weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d;
  at::Tensor out = at::empty(size, input.options().memory_format(channels_last ? at::MemoryFormat::ChannelsLast3d
                                                                               : at::MemoryFormat::Contiguous));
  p.input_strides = strides_of(input);
  p.output_strides = strides_of(out);
  p.weight_strides = strides_of(weight);
  direct_conv3d(*element_type(input.scalar_type()), input.data_ptr(), weight.data_ptr(),
                present(bias) ? bias->data_ptr() : nullptr, out.data_ptr(), p,
                at::cuda::getDeviceProperties(input.device().index())->multiProcessorCount,
                at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace cutlassfuse
