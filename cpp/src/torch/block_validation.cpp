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

void check_input(const at::Tensor& input, const char* shape) {
  TORCH_CHECK_VALUE(input.dim() == 5, "cutlassfuse: input must be 5-D ", shape, ", got ", input.dim(), "-D with shape ",
                    input.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), "cutlassfuse: input must be a floating-point tensor, got ",
                   input.scalar_type());
}

// The convolution's geometry and channels: PyTorch's rules for nn.Conv3d (weight
// [C_out, C_in / groups, kD, kH, kW], no output_padding) or nn.ConvTranspose3d (weight
// [C_in, C_out / groups, kD, kH, kW]).
Problem validate_convolution(const ConvNormActivationArgs& a) {
  const at::Tensor& input = a.input;
  const at::Tensor& weight = a.weight;
  check_input(input, "(N, C_in, D, H, W)");
  TORCH_CHECK_VALUE(weight.dim() == 5, "cutlassfuse: weight must be 5-D, got ", weight.dim(), "-D with shape ",
                    weight.sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == input.scalar_type(), "cutlassfuse: weight dtype ", weight.scalar_type(),
                   " differs from input dtype ", input.scalar_type());
  check_same_device(input, "weight", weight);
  Problem p;
  p.stride = to_extent3(a.stride, "stride");
  p.padding = to_extent3(a.padding, "padding");
  p.output_padding = to_extent3(a.output_padding, "output_padding");
  p.dilation = to_extent3(a.dilation, "dilation");
  p.conv_groups = a.groups;
  TORCH_CHECK_VALUE(a.groups > 0, "cutlassfuse: groups must be positive, got ", a.groups);
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(p.stride[i] > 0, "cutlassfuse: stride must be positive, got ", a.stride);
    TORCH_CHECK_VALUE(p.dilation[i] > 0, "cutlassfuse: dilation must be positive, got ", a.dilation);
    TORCH_CHECK_VALUE(p.padding[i] >= 0, "cutlassfuse: padding must be non-negative, got ", a.padding);
    if (a.transposed) {
      TORCH_CHECK_VALUE(
          p.output_padding[i] >= 0 && (p.output_padding[i] < p.stride[i] || p.output_padding[i] < p.dilation[i]),
          "cutlassfuse: output_padding must be smaller than either stride or dilation, got output_padding=",
          a.output_padding, ", stride=", a.stride, ", dilation=", a.dilation);
    } else {
      TORCH_CHECK_VALUE(p.output_padding[i] == 0, "cutlassfuse: output_padding is a transposed convolution's, got ",
                        a.output_padding, " for Conv3d");
    }
  }
  p.batch = input.size(0);
  p.in_channels = input.size(1);
  TORCH_CHECK_VALUE(p.in_channels > 0 && input.size(2) > 0 && input.size(3) > 0 && input.size(4) > 0,
                    "cutlassfuse: only the batch of the input may be empty, got shape ", input.sizes());
  TORCH_CHECK_VALUE(p.in_channels % a.groups == 0, "cutlassfuse: input channels (", p.in_channels,
                    ") must be divisible by groups (", a.groups, ")");
  if (a.transposed) {
    TORCH_CHECK_VALUE(weight.size(0) == p.in_channels, "cutlassfuse: weight.shape[0] (", weight.size(0),
                      ") must equal the input's channels (", p.in_channels, ")");
    p.out_channels = weight.size(1) * a.groups;
  } else {
    TORCH_CHECK_VALUE(weight.size(1) * a.groups == p.in_channels, "cutlassfuse: weight.shape[1] * groups (",
                      weight.size(1), " * ", a.groups, ") must equal the input's channels (", p.in_channels, ")");
    p.out_channels = weight.size(0);
    TORCH_CHECK_VALUE(p.out_channels % a.groups == 0, "cutlassfuse: output channels (", p.out_channels,
                      ") must be divisible by groups (", a.groups, ")");
  }
  TORCH_CHECK_VALUE(p.out_channels > 0, "cutlassfuse: weight gives zero output channels");
  std::array<__int128, 3> output_size{};
  for (int i = 0; i < 3; ++i) {
    p.input_size[i] = input.size(2 + i);
    p.kernel_size[i] = weight.size(2 + i);
    TORCH_CHECK_VALUE(p.kernel_size[i] > 0, "cutlassfuse: kernel size must be positive, got weight shape ",
                      weight.sizes());
    output_size[i] =
        a.transposed
            ? transposed_conv_output_extent<__int128>(p.input_size[i], p.kernel_size[i], p.stride[i], p.padding[i],
                                                      p.output_padding[i], p.dilation[i])
            : conv_output_extent<__int128>(p.input_size[i], p.kernel_size[i], p.stride[i], p.padding[i], p.dilation[i]);
    TORCH_CHECK_VALUE(output_size[i] > 0, "cutlassfuse: the output would be empty along spatial dimension ", i,
                      " (input ", input.sizes(), ", kernel ", weight.sizes(), ", padding ", a.padding, ", dilation ",
                      a.dilation, ")");
  }
  TORCH_CHECK_VALUE(output_fits(p.batch, p.out_channels, output_size, input.element_size()),
                    "cutlassfuse: the output size overflows: input ", input.sizes(), ", weight ", weight.sizes(),
                    ", stride ", a.stride, ", padding ", a.padding, ", output_padding ", a.output_padding,
                    " and dilation ", a.dilation,
                    " give an output of more than 2^63 - 1 bytes (PyTorch's limit on a tensor's storage)");
  for (int i = 0; i < 3; ++i) p.output_size[i] = static_cast<int64_t>(output_size[i]);
  if (a.bias.has_value() && a.bias->defined()) check_same_device(input, "bias", *a.bias);
  check_optional_vector(a.bias, "bias", p.out_channels, input, /*same_dtype=*/true);
  return p;
}

}  // namespace

BlockProblem validate_block(const ConvNormActivationArgs& a) {
  BlockProblem block;
  block.conv = validate_convolution(a);
  block.transposed = a.transposed;
  validate_norm(a.num_groups, block.conv.out_channels, a.eps, a.norm_weight, a.norm_bias, a.input);
  block.conv.num_groups = a.num_groups;
  block.conv.eps = a.eps;
  block.activation = validate_activation(a.activation, a.input, block.conv.out_channels);
  block.position = a.activation_before_norm ? ActivationPosition::kBeforeNorm : ActivationPosition::kAfterNorm;
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

at::MemoryFormat block_output_memory_format(const ConvNormActivationArgs& a) {
  return output_memory_format(a.input, a.weight);
}

}  // namespace cutlassfuse
