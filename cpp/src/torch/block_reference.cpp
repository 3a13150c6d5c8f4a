// The block family's reference: ATen's convolution, GroupNorm and activation kernels.
// The CPU kernels of the ops, and their CUDA kernels for calls no kernel path takes.
#include <ATen/ATen.h>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"

namespace cutlassfuse {
namespace {

at::Tensor aten_convolution(const ConvNormActivationArgs& a) {
  return at::convolution(a.input, a.weight, std::nullopt, a.stride, a.padding, a.dilation, a.transposed,
                         a.output_padding, a.groups);
}

ActivationKind kind_of(const ActivationArgs& a) { return *activation_from_name(a.name); }

// GroupNorm of `x` in `format`, then the activation after it: (output, mean, rstd).
NormForBackward group_norm_then(const at::Tensor& x, int64_t num_groups, const std::optional<at::Tensor>& gamma,
                                const std::optional<at::Tensor>& beta, double eps, const ActivationArgs& after,
                                at::MemoryFormat format) {
  const at::ScalarType type = x.scalar_type();
  const auto [n, c, pixels] = group_norm_extents(x);
  const auto [normalized, mean, rstd] =
      at::native_group_norm(x.contiguous(group_norm_input_format(x)), as_type(gamma, type), as_type(beta, type), n, c,
                            pixels, num_groups, eps);
  const at::Tensor out = apply_activation(normalized, kind_of(after), after.parameter, after.weight);
  return {out.contiguous(format), mean.to(statistics_type(type)).view({n, num_groups}),
          rstd.to(statistics_type(type)).view({n, num_groups})};
}

BlockForBackward block_forward(const ConvNormActivationArgs& a) {
  const at::Tensor y = aten_convolution(a);
  at::Tensor x = a.bias.has_value() && a.bias->defined() ? y + per_channel(*a.bias, y) : y;
  const ActivationArgs identity{"identity", 0., std::nullopt};
  if (a.activation_before_norm)
    x = apply_activation(x, kind_of(a.activation), a.activation.parameter, a.activation.weight);
  const at::MemoryFormat format = block_output_memory_format(a);
  const auto [out, mean, rstd] = group_norm_then(x, a.num_groups, a.norm_weight, a.norm_bias, a.eps,
                                                 a.activation_before_norm ? identity : a.activation, format);
  const std::optional<at::Tensor> residual = residual_in(a, format);
  return {residual ? (out + *residual).contiguous(format) : out, y, mean, rstd};
}

}  // namespace

at::Tensor apply_activation(const at::Tensor& x, ActivationKind kind, double parameter,
                            const std::optional<at::Tensor>& weight) {
  switch (kind) {
    case ActivationKind::kIdentity: return x;
    case ActivationKind::kReLU: return at::relu(x);
    case ActivationKind::kLeakyReLU: return at::leaky_relu(x, parameter);
    case ActivationKind::kPReLU: return at::prelu(x, weight->to(x.scalar_type()));
    case ActivationKind::kSiLU: return at::silu(x);
    case ActivationKind::kGELU: return at::gelu(x, "none");
    case ActivationKind::kGELUTanh: return at::gelu(x, "tanh");
    case ActivationKind::kELU: return at::elu(x, parameter);
  }
  return x;
}

std::tuple<at::Tensor, at::Tensor> activation_backward(const at::Tensor& grad, const at::Tensor& x, ActivationKind kind,
                                                       double parameter, const std::optional<at::Tensor>& weight) {
  switch (kind) {
    case ActivationKind::kIdentity: return {grad, at::Tensor()};
    case ActivationKind::kReLU: return {at::threshold_backward(grad, x, 0), at::Tensor()};
    case ActivationKind::kLeakyReLU: return {at::leaky_relu_backward(grad, x, parameter, false), at::Tensor()};
    case ActivationKind::kPReLU: {
      const bool shared = weight->sym_size(0) == 1;
      const at::Tensor slopes = shared ? weight->to(x.scalar_type()) : per_channel(*weight, x);
      const at::Tensor positive = x > 0;
      const at::Tensor dx = at::where(positive, grad, grad * slopes);
      const at::Tensor contributions = at::where(positive, at::zeros({}, grad.options()), x * grad);
      const at::ScalarType statistics = statistics_type(x.scalar_type());
      return {dx, shared ? contributions.sum(statistics).view({1})
                         : contributions.sum({0, 2, 3, 4}, /*keepdim=*/false, statistics)};
    }
    case ActivationKind::kSiLU: return {at::silu_backward(grad, x), at::Tensor()};
    case ActivationKind::kGELU: return {at::gelu_backward(grad, x, "none"), at::Tensor()};
    case ActivationKind::kGELUTanh: return {at::gelu_backward(grad, x, "tanh"), at::Tensor()};
    case ActivationKind::kELU: return {at::elu_backward(grad, parameter, 1, 1, /*is_result=*/false, x), at::Tensor()};
  }
  return {grad, at::Tensor()};
}

at::Tensor reference_block_forward(const ConvNormActivationArgs& a) { return std::get<0>(block_forward(a)); }

BlockForBackward reference_block_forward_for_backward(const ConvNormActivationArgs& a) {
  auto [out, y, mean, rstd] = block_forward(a);
  return {out, y.contiguous(kept_conv_output_memory_format(a)), mean, rstd};
}

at::Tensor reference_norm_activation_forward(const NormActivationArgs& a) {
  return std::get<0>(reference_norm_activation_forward_for_backward(a));
}

NormForBackward reference_norm_activation_forward_for_backward(const NormActivationArgs& a) {
  return group_norm_then(a.input, a.num_groups, a.norm_weight, a.norm_bias, a.eps, a.activation,
                         a.input.suggest_memory_format());
}

}  // namespace cutlassfuse
