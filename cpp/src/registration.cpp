// The operators' schemas and their per-backend kernels.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "cutlassfuse/op.h"
#include "cutlassfuse/settings.h"
#include "cutlassfuse/subpixel.h"
#if CUTLASSFUSE_WITH_CUDA
#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/nvtx.h"
#endif

namespace cutlassfuse {
namespace {

// Keyword order and names follow torch.nn.functional.conv_transpose3d, then
// torch.nn.functional.group_norm (its weight/bias renamed norm_weight/norm_bias).
constexpr const char* kArguments =
    "(Tensor input, Tensor weight, Tensor? bias, Tensor? norm_weight, Tensor? norm_bias, int num_groups, "
    "float eps, int[3] stride, int[3] padding, int[3] output_padding, int groups, int[3] dilation, "
    "Tensor? packed_weight=None, Tensor? packed_bias=None)";

constexpr const char* kReference = "reference: ATen conv_transpose3d + relu + group_norm";

// Unpacks the schema's arguments into OpArgs for `Impl`: one signature for every kernel.
template <class Result, Result (*Impl)(const OpArgs&)>
Result kernel(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
              const std::optional<at::Tensor>& norm_weight, const std::optional<at::Tensor>& norm_bias,
              int64_t num_groups, double eps, at::IntArrayRef stride, at::IntArrayRef padding,
              at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,
              const std::optional<at::Tensor>& packed_weight, const std::optional<at::Tensor>& packed_bias) {
  return Impl({input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding, groups,
               dilation, packed_weight, packed_bias});
}

at::Tensor forward_reference(const OpArgs& args) {
  validate_and_describe(args);
  // The composite's own autograd bookkeeping is not wanted inside the op.
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return reference_forward(args);
}

std::string explain_reference(const OpArgs& args) {
  validate_and_describe(args);
  return std::string(kReference) + (args.input.is_cuda() ? ", because the library was built without CUDA kernels" : "");
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

#if CUTLASSFUSE_WITH_CUDA
at::Tensor forward_cuda(const OpArgs& args) {
  const Problem problem = validate_and_describe(args);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (std::optional<at::Tensor> fused = fused_forward_cuda(args, problem)) return *std::move(fused);
  if (fallback_unsupported_reason(args, problem).empty()) return fallback_forward_cuda(args, problem);
  const NvtxRange range("cutlassfuse.reference");
  return reference_forward(args);
}

std::string explain_cuda(const OpArgs& args) {
  const Problem problem = validate_and_describe(args);
  const std::string why_not_fused = fused_path_unsupported_reason(args, problem);
  if (why_not_fused.empty()) return "fused_sm90: " + fused_path_description(args, problem);
  const std::string why_not_fallback = fallback_unsupported_reason(args, problem);
  if (why_not_fallback.empty()) return fallback_description(args) + ", because " + why_not_fused;
  return std::string(kReference) + ", because " + why_not_fused + " and " + why_not_fallback;
}

at::Tensor conv_transpose3d_cutlass(const OpArgs& args) {
  return cutlass_dgrad_plain(args, validate_and_describe(args));
}

// Pins the sm90 kernel configuration ("" restores the heuristic), for benchmarks.
void set_dgrad_config(std::string_view name) {
  if (name.empty()) return sm90::set_config_override(std::nullopt);
  const auto config = sm90::config_from_name(name);
  std::string known;
  for (sm90::DgradConfig c : sm90::kDgradConfigs) {
    known += std::string(known.empty() ? "" : ", ") + sm90::config_name(c);
  }
  TORCH_CHECK_VALUE(config.has_value(), "cutlassfuse: unknown dgrad config '", name, "'; known: ", known);
  sm90::set_config_override(config);
}
#endif

}  // namespace

TORCH_LIBRARY(cutlassfuse, m) {
  m.def((std::string("conv_transpose3d_relu_group_norm") + kArguments + " -> Tensor").c_str());
  // Which implementation a call with these arguments takes, and why.
  m.def((std::string("explain") + kArguments + " -> str").c_str());
  // How float32 calls compute the convolution (settings.h); "pytorch" by default.
  m.def("set_float32_mode(str mode) -> ()", [](c10::string_view name) {
    const auto mode = float32_mode_from_name(name);
    TORCH_CHECK_VALUE(mode.has_value(), "cutlassfuse: unknown float32 mode '", name,
                      "'; known: ", float32_mode_names());
    set_float32_mode(*mode);
  });
  m.def("float32_mode() -> str", [] { return std::string(float32_mode_name(float32_mode())); });
  m.def(
      "subpixel_plan(int[3] input_size, int[3] kernel_size, int[3] stride, int[3] padding, int[3] output_padding, "
      "int[3] dilation, int in_channels, int out_channels) -> int[]",
      &subpixel_plan);
#if CUTLASSFUSE_WITH_CUDA
  m.def("set_dgrad_config(str name) -> ()", [](c10::string_view name) { set_dgrad_config(name); });
  // Off: the ping-pong kernel runs the K blocks of taps reaching none of a tile's pixels
  // too (the measurement of what skipping them saves; benchmarks).
  m.def("set_skip_border_taps(bool enabled) -> ()", [](bool enabled) { sm90::set_skip_border_taps(enabled); });
  // Off: the ping-pong kernel's CTAs walk their tiles statically instead of drawing them
  // (the measurement of what drawing saves; benchmarks).
  m.def("set_drawn_tile_schedule(bool enabled) -> ()", [](bool enabled) { sm90::set_drawn_tile_schedule(enabled); });
  // Turns the fused sm90 path off or on, so CUDA calls take the fallback (benchmarks).
  m.def("set_fused_path_enabled(bool enabled) -> ()", [](bool enabled) { set_fused_path_enabled(enabled); });
  // Spreads the sub-pixel phases of one call over this many streams (1 to 8; benchmarks).
  m.def("set_phase_streams(int lanes) -> ()", [](int64_t lanes) { set_phase_streams(lanes); });
  // The deconvolution alone through the stock CUTLASS kernel (benchmark baseline); the
  // GroupNorm arguments are accepted and ignored.
  m.def((std::string("conv_transpose3d_cutlass") + kArguments + " -> Tensor").c_str());
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) {
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_reference>);
  m.impl("explain", &kernel<std::string, &explain_reference>);
}

TORCH_LIBRARY_IMPL(cutlassfuse, Meta, m) { m.impl("explain", &kernel<std::string, &explain_meta>); }

// A library built without the CUDA toolkit still serves CUDA tensors, through ATen.
TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_cuda>);
  m.impl("explain", &kernel<std::string, &explain_cuda>);
  m.impl("conv_transpose3d_cutlass", &kernel<at::Tensor, &conv_transpose3d_cutlass>);
#else
  m.impl("conv_transpose3d_relu_group_norm", &kernel<at::Tensor, &forward_reference>);
  m.impl("explain", &kernel<std::string, &explain_reference>);
#endif
}

}  // namespace cutlassfuse
