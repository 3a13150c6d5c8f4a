// The reference implementation: ATen's ConvTranspose3d, ReLU and GroupNorm kernels.
// The CPU kernel of the op, and its CUDA kernel for calls no kernel path takes.
#include <ATen/ATen.h>

#include <array>
#include <vector>

#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"

namespace cutlassfuse {

namespace {

at::Tensor activation_of(const OpArgs& a) {
  at::Tensor y =
      at::conv_transpose3d(a.input, a.weight, a.bias, a.stride, a.padding, a.output_padding, a.groups, a.dilation);
  return y.relu_();
}

}  // namespace

at::Tensor reference_forward(const OpArgs& a) {
  at::Tensor y = activation_of(a);
  const at::ScalarType type = y.scalar_type();
  y = at::group_norm(y, a.num_groups, as_type(a.norm_weight, type), as_type(a.norm_bias, type), a.eps);
  // ATen's kernels already follow this rule; stating it keeps the op's contract
  // (and its fake kernel) independent of backend details.
  return y.contiguous(output_memory_format(a.input, a.weight));
}

KeptTensor kept_tensor(bool keep_conv_output, bool keep_space_to_depth) {
  TORCH_CHECK_VALUE(!(keep_conv_output && keep_space_to_depth),
                    "cutlassfuse: keep_conv_output and keep_space_to_depth name two different kept tensors; set one");
  if (keep_conv_output) return KeptTensor::kConvOutput;
  return keep_space_to_depth ? KeptTensor::kActivationSpaceToDepth : KeptTensor::kActivation;
}

// [N, C, D*sD, H*sH, W*sW] -> [N, D, H, W, sD, sH, sW, C]: pixel (d*sD + i, h*sH + j,
// w*sW + k) is block position (i, j, k) of input pixel (d, h, w).
at::Tensor activation_to_space_to_depth(const at::Tensor& activation, at::IntArrayRef stride) {
  const auto size = activation.sym_sizes();
  std::vector<c10::SymInt> blocked{size[0]};
  for (int i = 0; i < 3; ++i) {
    blocked.push_back(size[2 + i] / stride[i]);
    blocked.push_back(c10::SymInt(stride[i]));
  }
  blocked.push_back(size[1]);
  return activation.permute({0, 2, 3, 4, 1}).reshape_symint(blocked).permute({0, 1, 3, 5, 2, 4, 6, 7}).contiguous();
}

at::Tensor activation_from_space_to_depth(const at::Tensor& kept) {
  const auto size = kept.sym_sizes();
  const std::vector<c10::SymInt> pixels{size[0], size[1] * size[4], size[2] * size[5], size[3] * size[6], size[7]};
  return kept.permute({0, 1, 4, 2, 5, 3, 6, 7}).contiguous().view_symint(pixels).permute({0, 4, 1, 2, 3});
}

ForwardForBackward reference_forward_for_backward(const OpArgs& a, KeptTensor kept) {
  // GroupNorm of the activation as reference_forward lays it out, so that the output is
  // the same bit for bit; the activation kept channels-last, as the backward reads it.
  // Keeping the convolution's output, the bias is added after the convolution (as the
  // kernel paths add it), and the output may differ from reference_forward's in the
  // last bits.
  const at::MemoryFormat out_format = output_memory_format(a.input, a.weight);
  at::Tensor conv_output;
  at::Tensor y;
  if (kept == KeptTensor::kConvOutput) {
    conv_output = at::conv_transpose3d(a.input, a.weight, std::nullopt, a.stride, a.padding, a.output_padding, a.groups,
                                       a.dilation)
                      .contiguous(out_format);
    y = (a.bias.has_value() && a.bias->defined() ? conv_output + per_channel(*a.bias, conv_output) : conv_output)
            .relu();
  } else {
    y = activation_of(a);
  }
  const at::ScalarType type = y.scalar_type();
  const auto [n, c, pixels] = group_norm_extents(y);
  const at::MemoryFormat format = group_norm_input_format(y);
  const auto [out, mean, rstd] = at::native_group_norm(y.contiguous(format), as_type(a.norm_weight, type),
                                                       as_type(a.norm_bias, type), n, c, pixels, a.num_groups, a.eps);
  at::Tensor kept_tensor = kept == KeptTensor::kConvOutput   ? conv_output
                           : kept == KeptTensor::kActivation ? y.contiguous(at::MemoryFormat::ChannelsLast3d)
                                                             : activation_to_space_to_depth(y, a.stride);
  return {out.contiguous(out_format), std::move(kept_tensor), mean.to(statistics_type(type)).view({n, a.num_groups}),
          rstd.to(statistics_type(type)).view({n, a.num_groups})};
}

ReluGroupNormGradients reference_relu_group_norm_backward(const at::Tensor& grad_output, const at::Tensor& activation,
                                                          const at::Tensor& mean, const at::Tensor& rstd,
                                                          const std::optional<at::Tensor>& norm_weight,
                                                          int64_t num_groups) {
  if (activation.dim() == 8) {
    return reference_relu_group_norm_backward(grad_output, activation_from_space_to_depth(activation), mean, rstd,
                                              norm_weight, num_groups);
  }
  const at::ScalarType type = activation.scalar_type();
  const auto [n, c, pixels] = group_norm_extents(activation);
  // ATen's CUDA kernel reads both tensors in the contiguous layout. Without gamma
  // GroupNorm's input gradient is that of gamma = 1; with it given, the
  // kernel also returns gamma's and beta's gradients.
  const at::Tensor gamma =
      norm_weight.has_value() && norm_weight->defined() ? norm_weight->to(type) : at::ones({c}, activation.options());
  const auto [da, dgamma, dbeta] =
      at::native_group_norm_backward(grad_output.contiguous(), activation.contiguous(), mean.to(type), rstd.to(type),
                                     gamma, n, c, pixels, num_groups, {true, true, true});
  // ReLU passes the gradient where its output is positive.
  const at::Tensor dz = at::threshold_backward(da, activation, 0).contiguous(at::MemoryFormat::ChannelsLast3d);
  const at::ScalarType statistics = statistics_type(type);
  return {dz, dgamma.to(statistics), dbeta.to(statistics), dz.sum({0, 2, 3, 4}, /*keepdim=*/false, statistics)};
}

at::Tensor reference_convert_memory_format(const at::Tensor& self, bool channels_last) {
  return self.clone(channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous);
}

Problem conv_transpose_problem(const at::Tensor& input, const at::Tensor& weight, const ConvTransposeGeometry& g) {
  const auto size = [](const at::Tensor& t, int64_t dim) { return t.sym_size(dim).guard_int(__FILE__, __LINE__); };
  Problem p;
  p.batch = size(input, 0);
  p.in_channels = size(input, 1);
  p.out_channels = size(weight, 1) * g.groups;
  p.conv_groups = g.groups;
  for (int i = 0; i < 3; ++i) {
    p.input_size[i] = size(input, 2 + i);
    p.kernel_size[i] = size(weight, 2 + i);
    p.stride[i] = g.stride[i];
    p.padding[i] = g.padding[i];
    p.output_padding[i] = g.output_padding[i];
    p.dilation[i] = g.dilation[i];
    p.output_size[i] = transposed_conv_output_extent(p.input_size[i], p.kernel_size[i], p.stride[i], p.padding[i],
                                                     p.output_padding[i], p.dilation[i]);
  }
  return p;
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_gradients(const at::Tensor& grad_output,
                                                                     const at::Tensor& input, const at::Tensor& weight,
                                                                     const ConvTransposeGeometry& g,
                                                                     std::array<bool, 3> mask) {
  return at::convolution_backward_symint(grad_output, input, weight, std::nullopt, c10::fromIntArrayRefSlow(g.stride),
                                         c10::fromIntArrayRefSlow(g.padding), c10::fromIntArrayRefSlow(g.dilation),
                                         /*transposed=*/true, c10::fromIntArrayRefSlow(g.output_padding), g.groups,
                                         mask);
}

}  // namespace

at::Tensor reference_conv_transpose3d_input_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                 const at::Tensor& weight, const ConvTransposeGeometry& g) {
  return std::get<0>(convolution_gradients(grad_output, input, weight, g, {true, false, false}))
      .contiguous(at::MemoryFormat::ChannelsLast3d);
}

at::Tensor reference_conv_transpose3d_weight_grad(const at::Tensor& grad_output, const at::Tensor& input,
                                                  const at::Tensor& weight, const ConvTransposeGeometry& g) {
  return std::get<1>(convolution_gradients(grad_output, input, weight, g, {false, true, false}))
      .contiguous(at::MemoryFormat::ChannelsLast3d);
}

}  // namespace cutlassfuse
