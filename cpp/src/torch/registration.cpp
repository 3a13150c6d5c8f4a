// The operators' schemas and their per-backend kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cutlassfuse/op.h"
#include "cutlassfuse/plan/subpixel.h"
#include "cutlassfuse/settings.h"
#include "torch/op_kernels.h"

namespace cutlassfuse {
namespace {

// Keyword order and names follow torch.nn.functional.conv_transpose3d, then
// torch.nn.functional.group_norm (its weight/bias renamed norm_weight/norm_bias).
#define CUTLASSFUSE_OP_SCHEMA_ARGUMENTS                                                                 \
  "Tensor input, Tensor weight, Tensor? bias, Tensor? norm_weight, Tensor? norm_bias, int num_groups, " \
  "float eps, int[3] stride, int[3] padding, int[3] output_padding, int groups, int[3] dilation, "      \
  "Tensor? packed_weight=None, Tensor? packed_bias=None"
constexpr const char* kArguments = "(" CUTLASSFUSE_OP_SCHEMA_ARGUMENTS ")";
// The op keeping for its backward: which tensor it keeps (op.h, KeptTensor,
// kept_for_backward) is an argument, so that a graph traced once (torch.compile) keeps
// what its backward reads.
constexpr const char* kKeepingArguments =
    "(" CUTLASSFUSE_OP_SCHEMA_ARGUMENTS ", bool keep_conv_output=False, bool keep_space_to_depth=False)";
#undef CUTLASSFUSE_OP_SCHEMA_ARGUMENTS

// The convolution-gradient ops' schema arguments as a geometry.
template <at::Tensor (*Impl)(const at::Tensor&, const at::Tensor&, const at::Tensor&, const ConvTransposeGeometry&)>
at::Tensor gradient_kernel(const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                           int64_t groups, at::IntArrayRef dilation) {
  return Impl(grad_output, input, weight, {stride, padding, output_padding, dilation, groups});
}

ForwardForBackward forward_for_backward_reference(const OpArgs& args, KeptTensor kept) {
  validate_kept(kept, validate_and_describe(args));
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return reference_forward_for_backward(args, kept);
}

at::Tensor forward_reference(const OpArgs& args) {
  validate_and_describe(args);
  // The composite's own autograd bookkeeping is not wanted inside the op.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return reference_forward(args);
}

std::string explain_reference_call(const OpArgs& args, const char* description) {
  validate_and_describe(args);
  return std::string(description) +
         (args.input.is_cuda() ? ", because the library was built without CUDA kernels" : "");
}

std::string explain_reference(const OpArgs& args) { return explain_reference_call(args, kReferenceDescription); }

std::string explain_for_backward_reference(const OpArgs& args) {
  return explain_reference_call(args, reference_for_backward_description(kept_for_backward(args)));
}

// Meta tensors carry no data: the op's Meta kernel (the fake kernel, ops.py) gives the
// output's shape, dtype and memory format.
std::string explain_meta(const OpArgs& args) {
  validate_and_describe(args);
  return "meta: the output's shape, dtype and memory format only, no computation";
}

// The sub-pixel phase plan the CUDA path launches for a deconvolution of these sizes,
// flattened for tests that execute it with ATen: [unreached pixels per sample, then per
// phase: input, filter and output views (offset, 3 extents, 4 strides each), lower
// padding, upper padding and dilation (3 each)].
std::vector<int64_t> subpixel_plan(at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef output_padding, at::IntArrayRef dilation,
                                   int64_t in_channels, int64_t out_channels) {
  Problem p;
  p.in_channels = in_channels;
  p.out_channels = out_channels;
  for (int i = 0; i < 3; ++i) {
    p.input_size[i] = input_size[i];
    p.kernel_size[i] = kernel_size[i];
    p.stride[i] = stride[i];
    p.padding[i] = padding[i];
    p.output_padding[i] = output_padding[i];
    p.dilation[i] = dilation[i];
    p.output_size[i] = transposed_conv_output_extent(input_size[i], kernel_size[i], stride[i], padding[i],
                                                     output_padding[i], dilation[i]);
  }
  const SubpixelPlan plan = plan_subpixel(p);
  std::vector<int64_t> flat{plan.unreached_pixels};
  auto append = [&flat](const auto& values) { flat.insert(flat.end(), values.begin(), values.end()); };
  for (const PhaseProblem& phase : plan.phases) {
    for (const StridedView* view : {&phase.input, &phase.filter, &phase.output}) {
      flat.push_back(view->offset);
      append(view->extent);
      append(view->stride);
    }
    append(phase.lower_padding);
    append(phase.upper_padding);
    append(phase.dilation);
  }
  return flat;
}

void set_float32_mode_by_name(c10::string_view name) {
  const auto mode = float32_mode_from_name(name);
  TORCH_CHECK_VALUE(mode.has_value(), "cutlassfuse: unknown float32 mode '", name, "'; known: ", float32_mode_names());
  set_float32_mode(*mode);
}

std::string float32_mode_name_now() { return float32_mode_name(current_options().float32_mode); }

std::vector<std::string> dgrad_config_names() {
  std::vector<std::string> names;
  for (sm90::DgradConfig c : sm90::kDgradConfigs) names.emplace_back(sm90::config_name(c));
  return names;
}

// The sm90 kernel configuration named `name`, or nothing for "auto" (the heuristic).
std::optional<sm90::DgradConfig> dgrad_config_named(std::string_view name) {
  if (name == "auto") return std::nullopt;
  const auto config = sm90::config_from_name(name);
  if (!config) {
    std::string known = "auto";
    for (const std::string& n : dgrad_config_names()) known += ", " + n;
    TORCH_CHECK_VALUE(false, "cutlassfuse: unknown dgrad_config '", name, "'; known: ", known);
  }
  return config;
}

ConvGradients conv_gradients_named(std::string_view name) {
  const auto choice = conv_gradients_from_name(name);
  TORCH_CHECK_VALUE(choice.has_value(), "cutlassfuse: unknown conv_gradients '", name,
                    "'; known: ", conv_gradients_names());
  return *choice;
}

using FlagsTuple = std::tuple<bool, std::string, bool, bool, int64_t, std::string, bool>;

FlagsTuple flags_tuple(const BackendFlags& f) {
  return {f.fused_path,       f.dgrad_config ? sm90::config_name(*f.dgrad_config) : "auto",
          f.skip_border_taps, f.drawn_tile_schedule,
          f.phase_streams,    conv_gradients_name(f.conv_gradients),
          f.resident_norm};
}

// Sets the flags given (absent ones keep theirs) in one step; returns the flags before.
FlagsTuple set_backend_flags_from_schema(std::optional<bool> fused_path, std::optional<c10::string_view> dgrad_config,
                                         std::optional<bool> skip_border_taps, std::optional<bool> drawn_tile_schedule,
                                         std::optional<int64_t> phase_streams,
                                         std::optional<c10::string_view> conv_gradients,
                                         std::optional<bool> resident_norm) {
  return flags_tuple(exchange_backend_flags([&](BackendFlags f) {
    f.fused_path = fused_path.value_or(f.fused_path);
    if (dgrad_config) f.dgrad_config = dgrad_config_named(*dgrad_config);
    f.skip_border_taps = skip_border_taps.value_or(f.skip_border_taps);
    f.drawn_tile_schedule = drawn_tile_schedule.value_or(f.drawn_tile_schedule);
    f.phase_streams = phase_streams.value_or(f.phase_streams);
    if (conv_gradients) f.conv_gradients = conv_gradients_named(*conv_gradients);
    f.resident_norm = resident_norm.value_or(f.resident_norm);
    return f;
  }));
}

FlagsTuple backend_flags_for_schema() { return flags_tuple(current_options().backend); }

}  // namespace

#if !CUTLASSFUSE_WITH_CUDA
// Without CUDA kernels every call runs the reference, which keeps the activation.
KeptTensor kept_for_backward(const OpArgs&) { return KeptTensor::kActivation; }
#endif

TORCH_LIBRARY(cutlassfuse, m) {
  m.def((std::string("conv_transpose3d_relu_group_norm") + kArguments + " -> Tensor").c_str());
  // Which implementation a call with these arguments takes, and why; explain_for_backward
  // the same of a call that keeps what its backward reads (a call in grad mode on
  // tensors that require grad), and what it keeps.
  m.def((std::string("explain") + kArguments + " -> str").c_str());
  m.def((std::string("explain_for_backward") + kArguments + " -> str").c_str());
  // The op keeping what its backward reads (autograd.cpp): (output, kept tensor, mean,
  // rstd [batch, num_groups]; op.h, KeptTensor): the activation ReLU(ConvTranspose3d(...))
  // channels_last_3d, with keep_conv_output the convolution's output without bias, with
  // keep_space_to_depth the activation in the pixel-shuffle GEMM's order.
  m.def((std::string("conv_transpose3d_relu_group_norm_for_backward") + kKeepingArguments +
         " -> (Tensor, Tensor, Tensor, Tensor)")
            .c_str());
  // From the output gradient and what the forward kept (the activation in pixel order
  // or in space-to-depth order): the gradients of the convolution's output (with bias),
  // gamma, beta and the convolution's bias.
  m.def(
      "relu_group_norm_backward(Tensor grad_output, Tensor activation, Tensor mean, Tensor rstd, Tensor? norm_weight, "
      "int num_groups) -> (Tensor, Tensor, Tensor, Tensor)");
  // A new copy of a tensor in channels_last_3d or the contiguous format (the backward's
  // layout changes, at memory bandwidth on CUDA).
  m.def("convert_memory_format(Tensor self, bool channels_last) -> Tensor");
  // The transposed convolution's input and weight gradients from its output's, each
  // channels-last (the backward's, when the CUTLASS conv-gradient kernels take them).
  m.def(
      "conv_transpose3d_input_grad(Tensor grad_output, Tensor input, Tensor weight, int[3] stride, int[3] padding, "
      "int[3] output_padding, int groups, int[3] dilation) -> Tensor");
  m.def(
      "conv_transpose3d_weight_grad(Tensor grad_output, Tensor input, Tensor weight, int[3] stride, int[3] padding, "
      "int[3] output_padding, int groups, int[3] dilation) -> Tensor");
  // How float32 calls compute the convolution (settings.h); "pytorch" by default.
  m.def("set_float32_mode(str mode) -> ()", &set_float32_mode_by_name);
  m.def("float32_mode() -> str", &float32_mode_name_now);
  // The benchmark switches of cutlassfuse.backends (settings.h): the given ones set in
  // one step, validated before any changes; returns the flags before.
  m.def(
      "set_backend_flags(bool? fused_path=None, str? dgrad_config=None, bool? skip_border_taps=None, "
      "bool? drawn_tile_schedule=None, int? phase_streams=None, str? conv_gradients=None, "
      "bool? resident_norm=None) -> (bool, str, bool, bool, int, str, bool)",
      &set_backend_flags_from_schema);
  m.def("backend_flags() -> (bool, str, bool, bool, int, str, bool)", &backend_flags_for_schema);
  m.def("dgrad_configs() -> str[]", &dgrad_config_names);
  m.def(
      "subpixel_plan(int[3] input_size, int[3] kernel_size, int[3] stride, int[3] padding, int[3] output_padding, "
      "int[3] dilation, int in_channels, int out_channels) -> int[]",
      &subpixel_plan);
#if CUTLASSFUSE_WITH_BASELINE_KERNELS
  // The deconvolution alone through the stock CUTLASS kernel (benchmark baseline); the
  // GroupNorm arguments are accepted and ignored.
  m.def((std::string("conv_transpose3d_cutlass") + kArguments + " -> Tensor").c_str());
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) {
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_reference>);
  m.impl("conv_transpose3d_relu_group_norm_for_backward",
         &keeping_kernel<ForwardForBackward, &forward_for_backward_reference>);
  m.impl("relu_group_norm_backward", &reference_relu_group_norm_backward);
  m.impl("convert_memory_format", &reference_convert_memory_format);
  m.impl("conv_transpose3d_input_grad", &gradient_kernel<&reference_conv_transpose3d_input_grad>);
  m.impl("conv_transpose3d_weight_grad", &gradient_kernel<&reference_conv_transpose3d_weight_grad>);
  m.impl("explain", &kernel<std::string, &explain_reference>);
  m.impl("explain_for_backward", &kernel<std::string, &explain_for_backward_reference>);
}

TORCH_LIBRARY_IMPL(cutlassfuse, Meta, m) {
  m.impl("explain", &kernel<std::string, &explain_meta>);
  m.impl("explain_for_backward", &kernel<std::string, &explain_meta>);
}

// A library built without the CUDA toolkit still serves CUDA tensors, through ATen.
TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_cuda>);
  m.impl("conv_transpose3d_relu_group_norm_for_backward",
         &keeping_kernel<ForwardForBackward, &forward_for_backward_cuda>);
  m.impl("relu_group_norm_backward", &relu_group_norm_backward_cuda);
  m.impl("convert_memory_format", &convert_memory_format_cuda);
  m.impl("conv_transpose3d_input_grad", &gradient_kernel<&cutlass_conv_transpose3d_input_grad>);
  m.impl("conv_transpose3d_weight_grad", &gradient_kernel<&cutlass_conv_transpose3d_weight_grad>);
  m.impl("explain", &kernel<std::string, &explain_cuda>);
  m.impl("explain_for_backward", &kernel<std::string, &explain_for_backward_cuda>);
#if CUTLASSFUSE_WITH_BASELINE_KERNELS
  m.impl("conv_transpose3d_cutlass", &kernel<at::Tensor, &cutlass_dgrad_plain>);
#endif
#else
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_reference>);
  m.impl("conv_transpose3d_relu_group_norm_for_backward",
         &keeping_kernel<ForwardForBackward, &forward_for_backward_reference>);
  m.impl("relu_group_norm_backward", &reference_relu_group_norm_backward);
  m.impl("convert_memory_format", &reference_convert_memory_format);
  m.impl("conv_transpose3d_input_grad", &gradient_kernel<&reference_conv_transpose3d_input_grad>);
  m.impl("conv_transpose3d_weight_grad", &gradient_kernel<&reference_conv_transpose3d_weight_grad>);
  m.impl("explain", &kernel<std::string, &explain_reference>);
  m.impl("explain_for_backward", &kernel<std::string, &explain_for_backward_reference>);
#endif
}

}  // namespace cutlassfuse
