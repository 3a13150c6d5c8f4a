// The block family's backward, registered at the Autograd key in C++ (a call that needs
// no gradient costs one redispatch; see autograd.cpp).
//
// Saved: the inputs, and what the forward that keeps them returns (block.h): the
// convolution's output y without its bias, in the convolution's layout (no copy of
// it is made), and the norm's mean and rstd. The backward recomputes what it reads
// from those: z = y + bias, the norm's input x = act(z) (activation before the norm) or
// z, and for an activation after the norm its input, the normalized x. Then the
// activation's backward, GroupNorm's backward (ATen's kernel), the bias gradient, and
// the convolution's gradients (ATen's convolution_backward, under PyTorch's switches).
// Under create_graph the gradients come from the composite recomputed with
// differentiable ops, so that a second backward runs through it.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>
#include <string>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"
#include "torch/block_redispatch.h"

namespace cutlassfuse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor or_undefined(const OptionalTensor& t) { return present(t) ? *t : at::Tensor(); }
OptionalTensor or_none(const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

bool requires_grad(const OptionalTensor& t) { return present(t) && t->requires_grad(); }

// The activation as saved_data holds it.
struct SavedActivation {
  ActivationKind kind;
  double parameter;
  at::Tensor weight;  // PReLU's, else undefined

  void save(AutogradContext* ctx) const {
    ctx->saved_data["activation"] = static_cast<int64_t>(kind);
    ctx->saved_data["activation_parameter"] = parameter;
  }
  static ActivationKind kind_of(AutogradContext* ctx) {
    return static_cast<ActivationKind>(ctx->saved_data["activation"].toInt());
  }
};

at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {
  return v.to(like.scalar_type()).view({1, -1, 1, 1, 1});
}

// GroupNorm of x from its saved statistics, with gamma and beta: the activation's input
// when it follows the norm.
at::Tensor normalized(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& gamma,
                      const at::Tensor& beta) {
  const c10::SymInt n = x.sym_size(0), groups = mean.sym_size(1);
  at::Tensor v = ((x.contiguous().view_symint({n, groups, -1}) - mean.unsqueeze(2)) * rstd.unsqueeze(2))
                     .view_symint(x.sym_sizes());
  if (gamma.defined()) v = v * per_channel(gamma, v);
  if (beta.defined()) v = v + per_channel(beta, v);
  return v.to(x.scalar_type());
}

// Gradients of the norm and the activation around it, from the output's.
struct NormGradients {
  at::Tensor input;  // of the norm's input z (before the activation, when it precedes the norm)
  at::Tensor gamma, beta, slopes;
};

NormGradients norm_activation_backward(const at::Tensor& grad, const at::Tensor& z, const at::Tensor& mean,
                                       const at::Tensor& rstd, const at::Tensor& gamma, const at::Tensor& beta,
                                       int64_t num_groups, const SavedActivation& act, bool before_norm,
                                       std::array<bool, 2> need_affine) {
  const at::ScalarType type = z.scalar_type();
  const at::Tensor x = before_norm ? apply_activation(z, act.kind, act.parameter, or_none(act.weight)) : z;
  NormGradients g;
  at::Tensor dn = grad;
  if (!before_norm) {
    std::tie(dn, g.slopes) =
        activation_backward(grad, normalized(x, mean, rstd, gamma, beta), act.kind, act.parameter, or_none(act.weight));
  }
  const c10::SymInt n = x.sym_size(0), c = x.sym_size(1), pixels = x.sym_size(2) * x.sym_size(3) * x.sym_size(4);
  const at::Tensor gamma_or_ones = gamma.defined() ? gamma.to(type) : at::ones_symint({c}, x.options());
  auto [dx, dgamma, dbeta] = at::native_group_norm_backward_symint(dn.contiguous(), x.contiguous(), mean.to(type),
                                                                   rstd.to(type), gamma_or_ones, n, c, pixels,
                                                                   num_groups, {true, need_affine[0], need_affine[1]});
  if (need_affine[0]) g.gamma = dgamma.to(gamma.scalar_type());
  if (need_affine[1]) g.beta = dbeta.to(beta.scalar_type());
  g.input = dx;
  if (before_norm)
    std::tie(g.input, g.slopes) = activation_backward(dx, z, act.kind, act.parameter, or_none(act.weight));
  return g;
}

// The gradients of the differentiable inputs that need one, from a composite forward
// recomputed with differentiable ops (double backward).
variable_list differentiable_gradients(const at::Tensor& out, const variable_list& inputs,
                                       const std::vector<bool>& need, const at::Tensor& grad) {
  variable_list wanted;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (need[i]) wanted.push_back(inputs[i]);
  }
  const variable_list found = torch::autograd::grad({out}, wanted, {grad}, /*retain_graph=*/true,
                                                    /*create_graph=*/true, /*allow_unused=*/true);
  variable_list grads(inputs.size());
  for (size_t i = 0, next = 0; i < inputs.size(); ++i) {
    if (need[i]) grads[i] = found[next++];
  }
  return grads;
}

// needs_input_grad counts the tensors the call passed (absent optionals take no edge).
std::vector<bool> needed(AutogradContext* ctx, const variable_list& saved, size_t count) {
  std::vector<bool> need(count, false);
  size_t edge = 0;
  for (size_t i = 0; i < count; ++i) {
    if (saved[i].defined()) need[i] = ctx->needs_input_grad(edge++);
  }
  return need;
}

// Argument positions in the block schema of its tensors.
enum BlockTensor { kInput, kWeight, kBias, kNormWeight, kNormBias, kSlopes, kBlockTensors };
constexpr int kBlockSchemaArguments = 17;
constexpr int kBlockSchemaPosition[kBlockTensors] = {0, 1, 2, 10, 11, 15};

class ConvNormActivation : public torch::autograd::Function<ConvNormActivation> {
 public:
  static at::Tensor forward(AutogradContext* ctx, CUTLASSFUSE_BLOCK_PARAMETERS) {
    const auto [out, y, mean, rstd] = [&] {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      return block_for_backward_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
    }();
    ctx->save_for_backward({input, weight, or_undefined(bias), or_undefined(norm_weight), or_undefined(norm_bias),
                            or_undefined(activation_weight), y, mean, rstd});
    SavedActivation{*activation_from_name(activation), activation_parameter, {}}.save(ctx);
    ctx->saved_data["before_norm"] = activation_before_norm;
    ctx->saved_data["num_groups"] = num_groups;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["output_padding"] = output_padding.vec();
    ctx->saved_data["dilation"] = dilation.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["transposed"] = transposed;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<bool> need = needed(ctx, saved, kBlockTensors);
    const variable_list inputs(saved.begin(), saved.begin() + kBlockTensors);
    const variable_list grads = at::GradMode::is_enabled()
                                    ? differentiable_gradients(recompute(ctx, inputs), inputs, need, grad_outputs[0])
                                    : gradients(ctx, saved, need, grad_outputs[0]);
    variable_list schema_grads(kBlockSchemaArguments);
    for (int i = 0; i < kBlockTensors; ++i) schema_grads[kBlockSchemaPosition[i]] = grads[i];
    return schema_grads;
  }

 private:
  static std::vector<int64_t> ints(AutogradContext* ctx, const char* key) { return ctx->saved_data[key].toIntVector(); }

  static variable_list gradients(AutogradContext* ctx, const variable_list& saved, const std::vector<bool>& need,
                                 const at::Tensor& grad) {
    const at::Tensor &input = saved[kInput], &weight = saved[kWeight], &bias = saved[kBias];
    const at::Tensor& y = saved[kBlockTensors];
    const at::Tensor z = bias.defined() ? y + per_channel(bias, y) : y;
    const SavedActivation act{SavedActivation::kind_of(ctx), ctx->saved_data["activation_parameter"].toDouble(),
                              saved[kSlopes]};
    NormGradients g =
        norm_activation_backward(grad, z, saved[kBlockTensors + 1], saved[kBlockTensors + 2], saved[kNormWeight],
                                 saved[kNormBias], ctx->saved_data["num_groups"].toInt(), act,
                                 ctx->saved_data["before_norm"].toBool(), {need[kNormWeight], need[kNormBias]});
    variable_list grads(kBlockTensors);
    if (need[kBias]) grads[kBias] = g.input.sum({0, 2, 3, 4}, false, at::kFloat).to(bias.scalar_type());
    if (need[kInput] || need[kWeight]) {
      auto [dinput, dweight, unused] = at::convolution_backward(
          g.input, input, weight, std::nullopt, ints(ctx, "stride"), ints(ctx, "padding"), ints(ctx, "dilation"),
          ctx->saved_data["transposed"].toBool(), ints(ctx, "output_padding"), ctx->saved_data["groups"].toInt(),
          {need[kInput], need[kWeight], false});
      grads[kInput] = dinput;
      grads[kWeight] = dweight;
    }
    grads[kNormWeight] = g.gamma;
    grads[kNormBias] = g.beta;
    if (need[kSlopes]) grads[kSlopes] = g.slopes;
    return grads;
  }

  static at::Tensor recompute(AutogradContext* ctx, const variable_list& t) {
    const ActivationKind kind = SavedActivation::kind_of(ctx);
    const double parameter = ctx->saved_data["activation_parameter"].toDouble();
    const bool before = ctx->saved_data["before_norm"].toBool();
    at::Tensor x = at::convolution(t[kInput], t[kWeight], or_none(t[kBias]), ints(ctx, "stride"), ints(ctx, "padding"),
                                   ints(ctx, "dilation"), ctx->saved_data["transposed"].toBool(),
                                   ints(ctx, "output_padding"), ctx->saved_data["groups"].toInt());
    if (before) x = apply_activation(x, kind, parameter, or_none(t[kSlopes]));
    const at::ScalarType type = x.scalar_type();
    x = at::group_norm(x, ctx->saved_data["num_groups"].toInt(), as_type(or_none(t[kNormWeight]), type),
                       as_type(or_none(t[kNormBias]), type), ctx->saved_data["eps"].toDouble());
    return before ? x : apply_activation(x, kind, parameter, or_none(t[kSlopes]));
  }
};

// Argument positions in the standalone norm's schema of its tensors.
enum NormTensor { kNormInput, kGamma, kBeta, kNormSlopes, kNormTensors };
constexpr int kNormSchemaArguments = 8;
constexpr int kNormSchemaPosition[kNormTensors] = {0, 2, 3, 7};

class GroupNormActivation : public torch::autograd::Function<GroupNormActivation> {
 public:
  static at::Tensor forward(AutogradContext* ctx, CUTLASSFUSE_NORM_PARAMETERS) {
    const auto [out, mean, rstd] = [&] {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      return norm_for_backward_op().call(CUTLASSFUSE_NORM_ARGUMENTS);
    }();
    ctx->save_for_backward(
        {input, or_undefined(norm_weight), or_undefined(norm_bias), or_undefined(activation_weight), mean, rstd});
    SavedActivation{*activation_from_name(activation), activation_parameter, {}}.save(ctx);
    ctx->saved_data["num_groups"] = num_groups;
    ctx->saved_data["eps"] = eps;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<bool> need = needed(ctx, saved, kNormTensors);
    const variable_list inputs(saved.begin(), saved.begin() + kNormTensors);
    const ActivationKind kind = SavedActivation::kind_of(ctx);
    const double parameter = ctx->saved_data["activation_parameter"].toDouble();
    const int64_t num_groups = ctx->saved_data["num_groups"].toInt();
    variable_list grads(kNormTensors);
    if (at::GradMode::is_enabled()) {
      const at::Tensor& x = inputs[kNormInput];
      const at::ScalarType type = x.scalar_type();
      const at::Tensor out =
          apply_activation(at::group_norm(x, num_groups, as_type(or_none(inputs[kGamma]), type),
                                          as_type(or_none(inputs[kBeta]), type), ctx->saved_data["eps"].toDouble()),
                           kind, parameter, or_none(inputs[kNormSlopes]));
      grads = differentiable_gradients(out, inputs, need, grad_outputs[0]);
    } else {
      NormGradients g = norm_activation_backward(
          grad_outputs[0], saved[kNormInput], saved[kNormTensors], saved[kNormTensors + 1], saved[kGamma], saved[kBeta],
          num_groups, {kind, parameter, saved[kNormSlopes]}, /*before_norm=*/false, {need[kGamma], need[kBeta]});
      if (need[kNormInput]) grads[kNormInput] = g.input;
      grads[kGamma] = g.gamma;
      grads[kBeta] = g.beta;
      if (need[kNormSlopes]) grads[kNormSlopes] = g.slopes;
    }
    variable_list schema_grads(kNormSchemaArguments);
    for (int i = 0; i < kNormTensors; ++i) schema_grads[kNormSchemaPosition[i]] = grads[i];
    return schema_grads;
  }
};

at::Tensor block_autograd(CUTLASSFUSE_BLOCK_PARAMETERS) {
  const bool tracked = at::GradMode::is_enabled() &&
                       (input.requires_grad() || weight.requires_grad() || requires_grad(bias) ||
                        requires_grad(norm_weight) || requires_grad(norm_bias) || requires_grad(activation_weight));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return block_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
  }
  return ConvNormActivation::apply(CUTLASSFUSE_BLOCK_ARGUMENTS);
}

at::Tensor norm_autograd(CUTLASSFUSE_NORM_PARAMETERS) {
  const bool tracked = at::GradMode::is_enabled() && (input.requires_grad() || requires_grad(norm_weight) ||
                                                      requires_grad(norm_bias) || requires_grad(activation_weight));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return norm_op().call(CUTLASSFUSE_NORM_ARGUMENTS);
  }
  return GroupNormActivation::apply(CUTLASSFUSE_NORM_ARGUMENTS);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("conv3d_norm_activation", &block_autograd);
  m.impl("group_norm_activation", &norm_autograd);
}

}  // namespace cutlassfuse
