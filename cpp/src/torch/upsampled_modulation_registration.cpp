// The upsampled modulation's schema and per-backend kernels. ATen's ops are its reference
// (the CPU kernel, the CUDA kernel of a build without CUDA kernels and outside the pass's
// scope) and what a call with a forward-mode tangent runs. A call that autograd records runs
// the op's own kernel and records the reference's derivatives, recomputed from the saved
// tensors and differentiated by autograd (so that a second backward runs through them).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <array>
#include <string>
#include <vector>

#include "cutlassfuse/block.h"
#include "torch/autograd_node.h"
#include "torch/upsampled_modulation.h"

namespace cutlassfuse {
namespace {

using ModulationSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, c10::string_view,
                                       double);

// `small` upsampled to `size` (D, H, W) as the op defines it.
at::Tensor upsampled(const at::Tensor& small, at::IntArrayRef size, bool causal_frames) {
  if (!causal_frames) return at::upsample_nearest3d(small, size, std::nullopt, std::nullopt, std::nullopt);
  const at::Tensor first =
      at::upsample_nearest3d(small.narrow(2, 0, 1), {1, size[1], size[2]}, std::nullopt, std::nullopt, std::nullopt);
  if (size[0] == 1) return first;
  const at::Tensor later = at::upsample_nearest3d(
      small.narrow(2, 1, small.size(2) - 1), {size[0] - 1, size[1], size[2]}, std::nullopt, std::nullopt, std::nullopt);
  return at::cat({first, later}, 2);
}

// The reference's derivatives: the saved input, scale and shift.
struct UpsampledModulationBackward final : torch::autograd::Node {
  std::array<torch::autograd::SavedVariable, 3> tensors;
  bool causal_frames = false;
  std::string activation;
  double activation_parameter = 0;

  std::string name() const override { return "CutlassfuseUpsampledModulationBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return torch::autograd::variable_list(3);
    const std::vector<bool> need = wanted_gradients(*this);
    torch::autograd::variable_list saved = unpack_all(tensors);
    // Grad mode is on here only under create_graph (double backward): the recomputation
    // then joins the saved tensors' graph; otherwise it runs on detached copies.
    if (!at::GradMode::is_enabled()) {
      for (size_t i = 0; i < saved.size(); ++i) saved[i] = saved[i].detach().requires_grad_(need[i]);
    }
    const at::AutoGradMode grad_mode(true);
    const at::Tensor out =
        aten_upsampled_modulation(saved[0], saved[1], saved[2], causal_frames, activation, activation_parameter);
    return differentiable_gradients(out, saved, need, grads[0]);
  }

  void release_variables() override { release_all(tensors); }
};

// The op below autograd; where autograd records the call, the reference's derivatives as
// its node. A forward-mode tangent takes the reference.
at::Tensor upsampled_modulation_autograd(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                         bool causal_frames, c10::string_view activation, double activation_parameter) {
  if (torch::autograd::isFwGradDefined(input) || torch::autograd::isFwGradDefined(scale) ||
      torch::autograd::isFwGradDefined(shift))
    return aten_upsampled_modulation(input, scale, shift, causal_frames, activation, activation_parameter);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::upsampled_modulation", "")
                             .typed<ModulationSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, scale, shift, causal_frames, activation, activation_parameter);
  }();
  if (at::GradMode::is_enabled() && (input.requires_grad() || scale.requires_grad() || shift.requires_grad())) {
    record_node<UpsampledModulationBackward>(
        out,
        [&](UpsampledModulationBackward& n) {
          n.tensors = {torch::autograd::SavedVariable(input, false), torch::autograd::SavedVariable(scale, false),
                       torch::autograd::SavedVariable(shift, false)};
          n.causal_frames = causal_frames;
          n.activation = std::string(activation);
          n.activation_parameter = activation_parameter;
        },
        input, scale, shift);
  }
  return out;
}

}  // namespace

ActivationKind check_upsampled_modulation(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                          std::string_view activation) {
  TORCH_CHECK(input.dim() == 5, "cutlassfuse.upsampled_modulation: input must be 5-D (N, C, D, H, W), got ",
              input.dim(), " dimension(s)");
  TORCH_CHECK(scale.dim() == 5 && scale.sizes() == shift.sizes(),
              "cutlassfuse.upsampled_modulation: scale and shift must be 5-D tensors of one shape, got ", scale.sizes(),
              " and ", shift.sizes());
  TORCH_CHECK(scale.size(0) == input.size(0) && scale.size(1) == input.size(1),
              "cutlassfuse.upsampled_modulation: scale and shift must have the input's batch and channels (",
              input.size(0), ", ", input.size(1), "), got ", scale.sizes());
  TORCH_CHECK(scale.scalar_type() == input.scalar_type() && shift.scalar_type() == input.scalar_type(),
              "cutlassfuse.upsampled_modulation: scale and shift must have the input's type ", input.scalar_type(),
              ", got ", scale.scalar_type(), " and ", shift.scalar_type());
  TORCH_CHECK(scale.device() == input.device() && shift.device() == input.device(),
              "cutlassfuse.upsampled_modulation: scale and shift must be on the input's device ", input.device());
  const std::optional<ActivationKind> kind = activation_from_name(activation);
  TORCH_CHECK(kind.has_value() && *kind != ActivationKind::kPReLU, "cutlassfuse.upsampled_modulation: activation ",
              "must be one of identity, relu, leaky_relu, silu, gelu, gelu_tanh, elu, got '", std::string(activation),
              "'");
  return *kind;
}

at::Tensor aten_upsampled_modulation(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                     bool causal_frames, c10::string_view activation, double activation_parameter) {
  const ActivationKind kind = check_upsampled_modulation(input, scale, shift, activation);
  const at::IntArrayRef size = input.sizes().slice(2);
  const at::Tensor modulated =
      at::addcmul(upsampled(shift, size, causal_frames), input, upsampled(scale, size, causal_frames));
  return apply_activation(modulated, kind, activation_parameter, std::nullopt)
      .contiguous(input.suggest_memory_format());
}

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // act(input * up(scale) + up(shift)): a norm's output modulated by lower-resolution
  // tensors, nearest-upsampled to its frames and pixels (F.interpolate(t, size=...)); with
  // causal_frames, frame 0 from frame 0 and the later frames from the later ones, upsampled
  // apart (diffusers' CogVideoXSpatialNorm3D with an odd number of frames above one).
  m.def(
      "upsampled_modulation(Tensor input, Tensor scale, Tensor shift, bool causal_frames=False, "
      "str activation=\"identity\", float activation_parameter=0.) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("upsampled_modulation", &aten_upsampled_modulation); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("upsampled_modulation", &upsampled_modulation_cuda);
#else
  m.impl("upsampled_modulation", &aten_upsampled_modulation);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("upsampled_modulation", &upsampled_modulation_autograd); }

}  // namespace cutlassfuse
