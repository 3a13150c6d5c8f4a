// The channel RMS norm's schema and per-backend kernels. ATen's ops are its reference
// (the CPU kernel, the CUDA kernel of a build without CUDA kernels and outside the
// kernel's scope) and what a call with a forward-mode tangent runs. A call that autograd
// records runs the op's own kernel and records the reference's derivatives, recomputed
// from the saved tensors and differentiated by autograd (so that a second backward runs
// through them).
#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "cutlassfuse/block.h"
#include "torch/autograd_node.h"
#include "torch/channel_rms_norm.h"
#include "torch/checks.h"

namespace cutlassfuse {
namespace {

using ChannelRMSNormSignature = at::Tensor(const at::Tensor&, const std::optional<at::Tensor>&,
                                           const std::optional<at::Tensor>&, double, bool, c10::string_view, double);

// The reference's derivatives: the saved input, weight and bias (undefined where absent).
struct ChannelRMSNormBackward final : torch::autograd::Node {
  std::array<torch::autograd::SavedVariable, 3> tensors;
  double eps = 0;
  bool clamp = false;
  std::string activation;
  double activation_parameter = 0;

  std::string name() const override { return "CutlassfuseChannelRmsNormBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!grads[0].defined()) return torch::autograd::variable_list(3);
    const std::vector<bool> need = wanted_gradients(*this);
    torch::autograd::variable_list saved = unpack_all(tensors);
    // Grad mode is on here only under create_graph (double backward): the recomputation
    // then joins the saved tensors' graph; otherwise it runs on detached copies.
    if (!at::GradMode::is_enabled()) {
      for (size_t i = 0; i < saved.size(); ++i) {
        if (saved[i].defined()) saved[i] = saved[i].detach().requires_grad_(need[i]);
      }
    }
    const at::AutoGradMode grad_mode(true);
    const auto optional = [](const at::Tensor& t) { return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt; };
    const at::Tensor out = aten_channel_rms_norm(saved[0], optional(saved[1]), optional(saved[2]), eps, clamp,
                                                 activation, activation_parameter);
    return differentiable_gradients(out, saved, need, grads[0]);
  }

  void release_variables() override { release_all(tensors); }
};

// The op below autograd; where autograd records the call, the reference's derivatives as
// its node. A forward-mode tangent takes the reference.
at::Tensor channel_rms_norm_autograd(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                     const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                     c10::string_view activation, double activation_parameter) {
  const auto tangent = [](const std::optional<at::Tensor>& t) {
    return t.has_value() && torch::autograd::isFwGradDefined(*t);
  };
  if (torch::autograd::isFwGradDefined(input) || tangent(weight) || tangent(bias))
    return aten_channel_rms_norm(input, weight, bias, eps, clamp, activation, activation_parameter);
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("cutlassfuse::channel_rms_norm", "")
                             .typed<ChannelRMSNormSignature>();
  at::Tensor out = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(input, weight, bias, eps, clamp, activation, activation_parameter);
  }();
  const auto wants_grad = [](const std::optional<at::Tensor>& t) { return t.has_value() && t->requires_grad(); };
  if (at::GradMode::is_enabled() && (input.requires_grad() || wants_grad(weight) || wants_grad(bias))) {
    const auto saved = [](const std::optional<at::Tensor>& t) {
      return torch::autograd::SavedVariable(t.value_or(at::Tensor()), false);
    };
    record_node<ChannelRMSNormBackward>(
        out,
        [&](ChannelRMSNormBackward& n) {
          n.tensors = {torch::autograd::SavedVariable(input, false), saved(weight), saved(bias)};
          n.eps = eps;
          n.clamp = clamp;
          n.activation = std::string(activation);
          n.activation_parameter = activation_parameter;
        },
        input, weight, bias);
  }
  return out;
}

// `v`, (C,), shaped to broadcast over `like`'s channels.
at::Tensor over_channels(const at::Tensor& v, const at::Tensor& like) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

}  // namespace

ActivationKind check_channel_rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                      const std::optional<at::Tensor>& bias, double eps, std::string_view activation) {
  TORCH_CHECK(input.dim() >= 2, "cutlassfuse.channel_rms_norm: input must have a batch and a channel dimension ",
              "(N, C, ...), got ", input.dim(), " dimension(s)");
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()),
                   "cutlassfuse.channel_rms_norm: input must be a floating-point tensor, got ", input.scalar_type());
  const int64_t channels = input.size(1);
  check_optional_vector(weight, "channel_rms_norm: weight", channels, input, /*same_dtype=*/false);
  check_optional_vector(bias, "channel_rms_norm: bias", channels, input, /*same_dtype=*/false);
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (t->has_value() && (*t)->defined()) check_same_device(input, name, **t);
  }
  TORCH_CHECK_VALUE(eps >= 0 && !std::isnan(eps), "cutlassfuse.channel_rms_norm: eps must be non-negative, got ", eps);
  const std::optional<ActivationKind> kind = activation_from_name(activation);
  TORCH_CHECK(kind.has_value() && *kind != ActivationKind::kPReLU, "cutlassfuse.channel_rms_norm: activation ",
              "must be one of identity, relu, leaky_relu, silu, gelu, gelu_tanh, elu, got '", std::string(activation),
              "'");
  return *kind;
}

at::Tensor aten_channel_rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                 c10::string_view activation, double activation_parameter) {
  const ActivationKind kind = check_channel_rms_norm(input, weight, bias, eps, activation);
  const at::ScalarType compute = at::toOpMathType(input.scalar_type());
  const at::Tensor x = input.to(compute);
  // clamp: 1 / max(rms, eps), the rms through the vector norm (whose derivative is zero,
  // not NaN, at an all-zero pixel); else 1 / sqrt(mean(x^2) + eps).
  const at::Tensor inverse =
      clamp ? (at::linalg_vector_norm(x, 2, at::IntArrayRef{1}, /*keepdim=*/true) / std::sqrt(double(input.size(1))))
                  .clamp_min(eps)
                  .reciprocal()
            : (x.square().mean(1, /*keepdim=*/true) + eps).rsqrt();
  at::Tensor y = x * inverse;
  if (weight.has_value() && weight->defined()) y = y * over_channels(weight->to(compute), x);
  if (bias.has_value() && bias->defined()) y = y + over_channels(bias->to(compute), x);
  y = apply_activation(y, kind, activation_parameter, std::nullopt).to(input.scalar_type());
  if (y.strides() == input.strides()) return y;
  return at::empty_like(input).copy_(y);  // the input's strides, as the CUDA kernel writes
}

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // act(x * r * weight[c] + bias[c]) with r, per pixel, 1 / sqrt(mean over the channels of
  // x^2 + eps), or with clamp 1 / max(sqrt(mean(x^2)), eps): an RMS norm over dimension 1
  // (diffusers' WanRMS_norm is F.normalize(x, dim=1) * sqrt(C) * gamma + bias: clamp with
  // eps = 1e-12 / sqrt(C)). weight and bias: (C,), any floating type; computed in float32
  // for 16-bit input, rounded once; the output has the input's strides.
  m.def(
      "channel_rms_norm(Tensor input, Tensor? weight=None, Tensor? bias=None, float eps=1e-6, bool clamp=False, "
      "str activation=\"identity\", float activation_parameter=0.) -> Tensor");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("channel_rms_norm", &aten_channel_rms_norm); }

TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("channel_rms_norm", &channel_rms_norm_cuda);
#else
  m.impl("channel_rms_norm", &aten_channel_rms_norm);
#endif
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("channel_rms_norm", &channel_rms_norm_autograd); }

}  // namespace cutlassfuse
