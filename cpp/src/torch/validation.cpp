#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "cutlassfuse/op.h"
#include "cutlassfuse/plan/subpixel.h"
#include "torch/checks.h"

namespace cutlassfuse {

Extent3 to_extent3(at::IntArrayRef values, const char* name) {
  TORCH_CHECK_VALUE(values.size() == 3, "cutlassfuse: ", name, " must have 3 values (depth, height, width), got ",
                    values.size());
  return {values[0], values[1], values[2]};
}

void check_same_device(const at::Tensor& input, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.device() == input.device(), "cutlassfuse: expected all tensors to be on the same device, but found ",
              name, " on ", t.device(), " and input on ", input.device());
}

namespace {

// PyTorch's rule and error kind for operands on different devices (RuntimeError): every
// tensor argument on the input's device.
void check_op_devices(const OpArgs& a) {
  const std::pair<const char*, const std::optional<at::Tensor>*> optional[] = {{"bias", &a.bias},
                                                                               {"norm_weight", &a.norm_weight},
                                                                               {"norm_bias", &a.norm_bias},
                                                                               {"packed_weight", &a.packed_weight},
                                                                               {"packed_bias", &a.packed_bias}};
  check_same_device(a.input, "weight", a.weight);
  for (const auto& [name, t] : optional) {
    if (t->has_value() && (*t)->defined()) check_same_device(a.input, name, **t);
  }
}

}  // namespace

void check_optional_vector(const std::optional<at::Tensor>& t, const char* name, int64_t size, const at::Tensor& input,
                           bool same_dtype) {
  if (!t.has_value() || !t->defined()) return;
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == size, "cutlassfuse: ", name, " must have shape (", size, ",), got ",
                    t->sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(t->scalar_type()), "cutlassfuse: ", name,
                   " must be a floating-point tensor, got ", t->scalar_type());
  TORCH_CHECK_TYPE(!same_dtype || t->scalar_type() == input.scalar_type(), "cutlassfuse: ", name,
                   " must have the input's dtype ", input.scalar_type(), ", got ", t->scalar_type());
}

// Whether an output of these (exact, positive) sizes fits PyTorch's bound on a tensor's
// storage, 2^63 - 1 bytes (c10's storage size check): with at least one sample, so that
// its strides fit too. Each factor is below 2^63 and so is the running product, so no
// step overflows 128 bits.
bool output_fits(int64_t batch, int64_t channels, const std::array<__int128, 3>& spatial, int64_t element_size) {
  constexpr __int128 kMaxStorageBytes = std::numeric_limits<int64_t>::max();
  __int128 bytes = element_size;
  for (const __int128 extent :
       {__int128(std::max<int64_t>(batch, 1)), __int128(channels), spatial[0], spatial[1], spatial[2]}) {
    if (extent > kMaxStorageBytes) return false;
    bytes *= extent;
    if (bytes > kMaxStorageBytes) return false;
  }
  return true;
}

// The convolution's geometry and channels: PyTorch's rules for nn.Conv3d (weight
// [C_out, C_in / groups, kD, kH, kW], no output_padding) or nn.ConvTranspose3d (weight
// [C_in, C_out / groups, kD, kH, kW]).
Problem validate_convolution(const ConvolutionArgs& a) {
  const at::Tensor& input = a.input;
  const at::Tensor& weight = a.weight;
  TORCH_CHECK_VALUE(input.dim() == 5, "cutlassfuse: input must be 5-D (N, C_in, D, H, W), got ", input.dim(),
                    "-D with shape ", input.sizes());
  TORCH_CHECK_VALUE(weight.dim() == 5, "cutlassfuse: weight must be 5-D ",
                    a.transposed ? "(C_in, C_out / groups, kD, kH, kW)" : "(C_out, C_in / groups, kD, kH, kW)",
                    ", got ", weight.dim(), "-D with shape ", weight.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), "cutlassfuse: input must be a floating-point tensor, got ",
                   input.scalar_type());
  TORCH_CHECK_TYPE(weight.scalar_type() == input.scalar_type(), "cutlassfuse: weight dtype ", weight.scalar_type(),
                   " differs from input dtype ", input.scalar_type());
  check_same_device(input, "weight", weight);
  if (a.bias.has_value() && a.bias->defined()) check_same_device(input, "bias", *a.bias);
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
  // As ATen's convolutions: only the batch may be empty (zero input channels would also
  // reach the kernels as a GEMM with K = 0).
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
                      " (input ", input.sizes(), ", kernel ", weight.sizes(), ", padding ", a.padding, ")");
  }
  // Before anything is allocated: PyTorch's own check would name the sizes only after
  // int64 arithmetic wrapped, or a backend would fail on them first.
  TORCH_CHECK_VALUE(output_fits(p.batch, p.out_channels, output_size, input.element_size()),
                    "cutlassfuse: the output size overflows: input ", input.sizes(), ", weight ", weight.sizes(),
                    ", stride ", a.stride, ", padding ", a.padding, ", output_padding ", a.output_padding,
                    " and dilation ", a.dilation,
                    " give an output of more than 2^63 - 1 bytes (PyTorch's limit on a tensor's storage)");
  for (int i = 0; i < 3; ++i) p.output_size[i] = static_cast<int64_t>(output_size[i]);
  check_optional_vector(a.bias, "bias", p.out_channels, input, /*same_dtype=*/true);
  return p;
}

Problem validate_and_describe(const OpArgs& a) {
  const at::Tensor& input = a.input;
  const at::Tensor& weight = a.weight;
  Problem p = validate_convolution(
      {a.input, a.weight, a.bias, a.stride, a.padding, a.output_padding, a.groups, a.dilation, /*transposed=*/true});
  check_op_devices(a);
  p.num_groups = a.num_groups;
  p.eps = a.eps;
  TORCH_CHECK_VALUE(a.num_groups > 0 && p.out_channels % a.num_groups == 0, "cutlassfuse: num_groups (", a.num_groups,
                    ") must be positive and divide the output channels (", p.out_channels, ")");
  TORCH_CHECK_VALUE(std::isfinite(a.eps) && a.eps >= 0, "cutlassfuse: eps must be finite and non-negative, got ",
                    a.eps);
  check_optional_vector(a.norm_weight, "norm_weight", p.out_channels, input, /*same_dtype=*/false);
  check_optional_vector(a.norm_bias, "norm_bias", p.out_channels, input, /*same_dtype=*/false);
  if (a.packed_weight.has_value() && a.packed_weight->defined()) {
    const at::Tensor& packed = *a.packed_weight;
    // weight.permute(0, 2, 3, 4, 1)'s shape, without making the view on every call.
    const std::array<int64_t, 5> expected{weight.size(0), weight.size(2), weight.size(3), weight.size(4),
                                          weight.size(1)};
    TORCH_CHECK_VALUE(packed.sizes() == c10::IntArrayRef(expected),
                      "cutlassfuse: packed_weight must be weight.permute(0, 2, 3, 4, 1), shape ",
                      c10::IntArrayRef(expected), ", got ", packed.sizes());
    TORCH_CHECK_TYPE(packed.scalar_type() == weight.scalar_type(),
                     "cutlassfuse: packed_weight must have the weight's dtype ", weight.scalar_type(), ", got ",
                     packed.scalar_type());
  }
  if (a.packed_bias.has_value() && a.packed_bias->defined()) {
    TORCH_CHECK_VALUE(a.bias.has_value() && a.bias->defined(), "cutlassfuse: packed_bias given without a bias");
    const at::Tensor& packed = *a.packed_bias;
    const int64_t blocks = p.stride[0] * p.stride[1] * p.stride[2];
    TORCH_CHECK_VALUE(packed.dim() == 1 && packed.size(0) == blocks * p.out_channels && packed.is_contiguous(),
                      "cutlassfuse: packed_bias must be bias.repeat(prod(stride)), ", blocks * p.out_channels,
                      " contiguous values, got shape ", packed.sizes());
    TORCH_CHECK_TYPE(packed.scalar_type() == a.bias->scalar_type(),
                     "cutlassfuse: packed_bias must have the bias's dtype ", a.bias->scalar_type(), ", got ",
                     packed.scalar_type());
  }
  return p;
}

at::MemoryFormat output_memory_format(const at::Tensor& input, const at::Tensor& weight) {
  const bool channels_last = input.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d ||
                             weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d;
  return channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
}

void validate_kept(KeptTensor kept, const Problem& problem) {
  TORCH_CHECK_VALUE(kept != KeptTensor::kActivationSpaceToDepth || is_pixel_shuffle_gemm(problem),
                    "cutlassfuse: keep_space_to_depth needs a layer whose kernel_size equals its stride (above 1), "
                    "with no padding, output_padding or dilation and groups=1 (the pixel-shuffle GEMM's layers)");
}

}  // namespace cutlassfuse
