// The nearest upsampling's and the causal upsampling's schemas and per-backend kernels.
// ATen's upsample_nearest3d (for the causal one, ATen's upsampling of the first frame and
// of the later ones, concatenated) is the reference (the CPU kernel, and the CUDA kernel
// of a build without CUDA kernels), and what a call with a forward-mode tangent runs. A call that autograd records runs
// the op's own kernel and records ATen's derivative (upsample_nearest3d_backward, itself differentiable). Every kernel
// returns the output in the input's suggested memory format.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "torch/autograd_node.h"
#include "torch/upsample_nearest.h"

namespace cutlassfuse {
namespace {

using UpsampleSignature = at::Tensor(const at::Tensor&, at::IntArrayRef, std::optional<double>, std::optional<double>,
                                     std::optional<double>);

// ATen's derivative of the upsampling: each input element's gradient sums those of the
// output elements copied from it.
struct UpsampleNearest3dBackward final : torch::autograd::Node {
  std::vector<int64_t> input_size, output_size;
  std::optional<double> scales_d, scales_h, scales_w;

  std::string name() const override { return "CutlassfuseUpsampleNearest3DBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined() || !task_should_compute_output(0)) return torch::autograd::variable_list(1);
    return {at::upsample_nearest3d_backward(grads[0], output_size, input_size, scales_d, scales_h, scales_w)};
  }
};

// The op below autograd; where autograd records the call, ATen's derivative as its node.
// A forward-mode tangent takes ATen's differentiable upsampling.
at::Tensor upsample_nearest3d_autograd(const at::Tensor& input, at::IntArrayRef output_size,
                                       std::optional<double> scales_d, std::optional<double> scales_h,
                                       std::optional<double> scales_w) {
  if (torch::autograd::isFwGradDefined(input))
    return aten_upsample_nearest3d(input, output_size, scales_d, scales_h, scales_w);
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cutlassfuse::upsample_nearest3d", "").typed<UpsampleSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, output_size, scales_d, scales_h, scales_w);
  }();
  if (at::GradMode::is_enabled() && input.requires_grad()) {
    record_node<UpsampleNearest3dBackward>(
        out,
        [&](UpsampleNearest3dBackward& n) {
          n.input_size = input.sizes().vec();
          n.output_size = output_size.vec();
          n.scales_d = scales_d;
          n.scales_h = scales_h;
          n.scales_w = scales_w;
        },
        input);
  }
  return out;
}

using CausalUpsampleSignature = at::Tensor(const at::Tensor&, at::ArrayRef<double>);

// The causal upsampling's derivative: ATen's upsampling derivative of its first frame and
// of its later frames, concatenated along time.
struct CausalUpsampleNearest3dBackward final : torch::autograd::Node {
  std::vector<int64_t> input_size, output_size;
  std::vector<double> scale_factor;

  std::string name() const override { return "CutlassfuseCausalUpsampleNearest3DBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined() || !task_should_compute_output(0)) return torch::autograd::variable_list(1);
    const at::Tensor& grad = grads[0];
    const int64_t n = input_size[0], c = input_size[1], d = input_size[2], h = input_size[3], w = input_size[4];
    const int64_t out_d = output_size[0], out_h = output_size[1], out_w = output_size[2];
    const at::Tensor first = at::upsample_nearest3d_backward(grad.narrow(2, 0, 1), {1, out_h, out_w}, {n, c, 1, h, w},
                                                             1.0, scale_factor[1], scale_factor[2]);
    if (d == 1) return {first};
    const at::Tensor later =
        at::upsample_nearest3d_backward(grad.narrow(2, 1, out_d - 1), {out_d - 1, out_h, out_w}, {n, c, d - 1, h, w},
                                        scale_factor[0], scale_factor[1], scale_factor[2]);
    return {at::cat({first, later}, 2)};
  }
};

// The op below autograd; where autograd records the call, ATen's derivatives as its node.
// A forward-mode tangent takes ATen's differentiable composite.
at::Tensor causal_upsample_nearest3d_autograd(const at::Tensor& input, at::ArrayRef<double> scale_factor) {
  if (torch::autograd::isFwGradDefined(input)) return aten_causal_upsample_nearest3d(input, scale_factor);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::causal_upsample_nearest3d", "")
                             .typed<CausalUpsampleSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, scale_factor);
  }();
  if (at::GradMode::is_enabled() && input.requires_grad()) {
    record_node<CausalUpsampleNearest3dBackward>(
        out,
        [&](CausalUpsampleNearest3dBackward& n) {
          n.input_size = input.sizes().vec();
          n.output_size = {out.size(2), out.size(3), out.size(4)};
          n.scale_factor = scale_factor.vec();
        },
        input);
  }
  return out;
}

}  // namespace

std::array<int64_t, 3> causal_upsample_sizes(const at::Tensor& input, at::ArrayRef<double> scale_factor) {
  TORCH_CHECK(input.dim() == 5, "cutlassfuse.causal_upsample_nearest3d: input must be 5-D (N, C, D, H, W), got ",
              input.dim(), " dimension(s)");
  TORCH_CHECK(scale_factor.size() == 3 && scale_factor[0] > 0 && scale_factor[1] > 0 && scale_factor[2] > 0,
              "cutlassfuse.causal_upsample_nearest3d: scale_factor must be three positive factors (D, H, W)");
  const auto scaled = [](int64_t size, double factor) { return static_cast<int64_t>(std::floor(size * factor)); };
  const int64_t frames = input.size(2);
  return {frames > 1 ? 1 + scaled(frames - 1, scale_factor[0]) : frames, scaled(input.size(3), scale_factor[1]),
          scaled(input.size(4), scale_factor[2])};
}

at::Tensor aten_causal_upsample_nearest3d(const at::Tensor& input, at::ArrayRef<double> scale_factor) {
  const std::array<int64_t, 3> size = causal_upsample_sizes(input, scale_factor);
  const at::MemoryFormat format = input.suggest_memory_format();
  const at::Tensor first = at::upsample_nearest3d(input.narrow(2, 0, 1).contiguous(format), {1, size[1], size[2]}, 1.0,
                                                  scale_factor[1], scale_factor[2]);
  if (input.size(2) <= 1) return first.contiguous(format);
  const at::Tensor later =
      at::upsample_nearest3d(input.narrow(2, 1, input.size(2) - 1).contiguous(format), {size[0] - 1, size[1], size[2]},
                             scale_factor[0], scale_factor[1], scale_factor[2]);
  return at::cat({first, later}, 2).contiguous(format);
}

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // diffusers' HunyuanVideoUpsampleCausal3D upsampling: frame 0 upsampled in space, the
  // frames after it in time and space (scale_factor: D, H, W), in one output.
  m.def("causal_upsample_nearest3d(Tensor input, float[3] scale_factor) -> Tensor");
  // F.interpolate(input, ..., mode="nearest") on 5-D input: aten::upsample_nearest3d.
  m.def(
      "upsample_nearest3d(Tensor input, int[3] output_size, float? scales_d=None, float? scales_h=None, "
      "float? scales_w=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) {
  m.impl("upsample_nearest3d", &aten_upsample_nearest3d);
  m.impl("causal_upsample_nearest3d", &aten_causal_upsample_nearest3d);
}

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("upsample_nearest3d", &upsample_nearest3d_cuda);
  m.impl("causal_upsample_nearest3d", &causal_upsample_nearest3d_cuda);
#else
  m.impl("upsample_nearest3d", &aten_upsample_nearest3d);
  m.impl("causal_upsample_nearest3d", &aten_causal_upsample_nearest3d);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("upsample_nearest3d", &upsample_nearest3d_autograd);
  m.impl("causal_upsample_nearest3d", &causal_upsample_nearest3d_autograd);
}

}  // namespace cutlassfuse
