// Argument checks of the block family's operators (block.h), before anything runs.
#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <string>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/checks.h"

namespace cutlassfuse {
namespace {

std::string known_activations() {
  std::string names;
  for (std::string_view name : kActivationNames) names += (names.empty() ? "" : ", ") + std::string(name);
  return names;
}

ActivationKind validate_activation(const ActivationArgs& a, const at::Tensor& input, int64_t channels) {
  const std::optional<ActivationKind> kind = activation_from_name(a.name);
  TORCH_CHECK_VALUE(kind.has_value(), "cutlassfuse: unknown activation '", a.name, "'; known: ", known_activations());
  TORCH_CHECK_VALUE(std::isfinite(a.parameter), "cutlassfuse: activation_parameter must be finite, got ", a.parameter);
  const bool has_weight = a.weight.has_value() && a.weight->defined();
  if (*kind != ActivationKind::kPReLU) {
    TORCH_CHECK_VALUE(!has_weight, "cutlassfuse: activation_weight is PReLU's; activation '", a.name, "' takes none");
    return *kind;
  }
  TORCH_CHECK_VALUE(has_weight, "cutlassfuse: activation 'prelu' needs activation_weight (nn.PReLU's weight)");
  const at::Tensor& w = *a.weight;
  check_same_device(input, "activation_weight", w);
  TORCH_CHECK_VALUE(w.dim() == 1 && (w.size(0) == 1 || w.size(0) == channels),
                    "cutlassfuse: activation_weight must have shape (1,) or (", channels, ",), got ", w.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(w.scalar_type()),
                   "cutlassfuse: activation_weight must be a floating-point tensor, got ", w.scalar_type());
  return *kind;
}

void validate_norm(int64_t num_groups, int64_t channels, double eps, const std::optional<at::Tensor>& norm_weight,
                   const std::optional<at::Tensor>& norm_bias, const at::Tensor& input) {
  TORCH_CHECK_VALUE(num_groups > 0 && channels % num_groups == 0, "cutlassfuse: num_groups (", num_groups,
                    ") must be positive and divide the channels (", channels, ")");
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps >= 0, "cutlassfuse: eps must be finite and non-negative, got ", eps);
  for (const auto& [name, t] : {std::pair{"norm_weight", &norm_weight}, std::pair{"norm_bias", &norm_bias}}) {
    if (t->has_value() && (*t)->defined()) check_same_device(input, name, **t);
    check_optional_vector(*t, name, channels, input, /*same_dtype=*/false);
  }
}

void check_input(const at::Tensor& input, const char* shape, const char* name = "input") {
  TORCH_CHECK_VALUE(input.dim() == 5, "cutlassfuse: ", name, " must be 5-D ", shape, ", got ", input.dim(),
                    "-D with shape ", input.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), "cutlassfuse: ", name,
                   " must be a floating-point tensor, got ", input.scalar_type());
}

// A tensor of `like`'s shape, dtype and device.
void check_like(const at::Tensor& t, const char* name, const at::Tensor& like, const char* like_name) {
  check_same_device(like, name, t);
  TORCH_CHECK_VALUE(t.sizes() == like.sizes(), "cutlassfuse: ", name, " must have ", like_name, "'s shape ",
                    like.sizes(), ", got ", t.sizes());
  TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), "cutlassfuse: ", name, " must have ", like_name, "'s dtype ",
                   like.scalar_type(), ", got ", t.scalar_type());
}

// A norm's per-(sample, group) statistic: [batch, num_groups] floating values.
void check_statistic(const at::Tensor& t, const char* name, int64_t batch, int64_t num_groups,
                     const at::Tensor& input) {
  check_same_device(input, name, t);
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == batch && t.size(1) == num_groups, "cutlassfuse: ", name,
                    " must have shape (", batch, ", ", num_groups, "), got ", t.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "cutlassfuse: ", name, " must be a floating-point tensor, got ",
                   t.scalar_type());
}

// A module's kept copy of the weight: its shape, dtype and device, channels-last.
void check_packed_weight(const std::optional<at::Tensor>& packed, const at::Tensor& weight) {
  if (!packed.has_value() || !packed->defined()) return;
  check_like(*packed, "packed_weight", weight, "weight");
  TORCH_CHECK_VALUE(packed->is_contiguous(at::MemoryFormat::ChannelsLast3d),
                    "cutlassfuse: packed_weight must be channels_last_3d (weight.contiguous(memory_format="
                    "torch.channels_last_3d)), got strides ",
                    packed->strides());
}

// The residual added to the output: the output's shape and the input's dtype and device.
void check_residual(const std::optional<at::Tensor>& residual, const Problem& p, const at::Tensor& input) {
  if (!residual.has_value() || !residual->defined()) return;
  check_same_device(input, "residual", *residual);
  const std::array<int64_t, 5> shape{p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]};
  TORCH_CHECK_VALUE(residual->sizes() == c10::IntArrayRef(shape), "cutlassfuse: residual must have the output's shape ",
                    c10::IntArrayRef(shape), ", got ", residual->sizes());
  TORCH_CHECK_TYPE(residual->scalar_type() == input.scalar_type(), "cutlassfuse: residual must have the input's dtype ",
                   input.scalar_type(), ", got ", residual->scalar_type());
}

}  // namespace

BlockProblem validate_block(const ConvNormActivationArgs& a) {
  BlockProblem block;
  block.conv = validate_convolution(a);
  check_packed_weight(a.packed_weight, a.weight);
  block.transposed = a.transposed;
  validate_norm(a.num_groups, block.conv.out_channels, a.eps, a.norm_weight, a.norm_bias, a.input);
  block.conv.num_groups = a.num_groups;
  block.conv.eps = a.eps;
  block.activation = validate_activation(a.activation, a.input, block.conv.out_channels);
  block.position = a.activation_before_norm ? ActivationPosition::kBeforeNorm : ActivationPosition::kAfterNorm;
  check_residual(a.residual, block.conv, a.input);
  return block;
}

BlockProblem validate_norm_activation(const NormActivationArgs& a) {
  check_input(a.input, "(N, C, D, H, W)");
  BlockProblem block;
  Problem& p = block.conv;
  p.batch = a.input.size(0);
  p.in_channels = p.out_channels = a.input.size(1);
  TORCH_CHECK_VALUE(p.out_channels > 0, "cutlassfuse: input must have channels, got shape ", a.input.sizes());
  for (int i = 0; i < 3; ++i) p.input_size[i] = p.output_size[i] = a.input.size(2 + i);
  validate_norm(a.num_groups, p.out_channels, a.eps, a.norm_weight, a.norm_bias, a.input);
  p.num_groups = a.num_groups;
  p.eps = a.eps;
  block.activation = validate_activation(a.activation, a.input, p.out_channels);
  block.position = ActivationPosition::kAfterNorm;
  return block;
}

BlockProblem validate_norm_activation_backward(const NormActivationBackwardArgs& a) {
  const at::Tensor& y = a.conv_output;
  check_input(y, "(N, C, D, H, W)", "conv_output");
  check_like(a.grad_output, "grad_output", y, "conv_output");
  BlockProblem block =
      validate_norm_activation({y, a.num_groups, a.norm_weight, a.norm_bias, /*eps=*/0., a.activation});
  block.position = a.activation_before_norm ? ActivationPosition::kBeforeNorm : ActivationPosition::kAfterNorm;
  if (a.bias.has_value() && a.bias->defined()) check_same_device(y, "bias", *a.bias);
  check_optional_vector(a.bias, "bias", block.conv.out_channels, y, /*same_dtype=*/true);
  check_statistic(a.mean, "mean", block.conv.batch, a.num_groups, y);
  check_statistic(a.rstd, "rstd", block.conv.batch, a.num_groups, y);
  return block;
}

at::MemoryFormat block_output_memory_format(const ConvNormActivationArgs& a) {
  return output_memory_format(a.input, a.weight);
}

at::MemoryFormat kept_conv_output_memory_format(const ConvNormActivationArgs& a) {
  const at::ScalarType type = a.input.scalar_type();
  return a.input.is_cuda() && (type == at::kHalf || type == at::kBFloat16) ? at::MemoryFormat::ChannelsLast3d
                                                                           : block_output_memory_format(a);
}

}  // namespace cutlassfuse
