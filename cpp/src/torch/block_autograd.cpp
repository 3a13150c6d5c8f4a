// The block family's backward, registered at the Autograd key in C++ (a call that needs
// no gradient costs one redispatch; see autograd.cpp).
//
// Saved: the inputs, and what the forward that keeps them returns (block.h): the
// convolution's output y without its bias, as the forward wrote it (channels-last in 16
// bits on CUDA; no copy of it is made), and the norm's mean and rstd. The backward runs norm_activation_backward
// (block_backward_registration.cpp: this project's kernels on CUDA, ATen's composite
// elsewhere) for the gradients of the norm, the activation around it and the bias,
// then the convolution's gradients (conv_backward.h: ATen's convolution_backward under
// PyTorch's switches, on channels-last operands in 16 bits). Under create_graph the gradients come from the composite
// recomputed with differentiable ops, so that a second backward runs through it.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string_view>
#include <utility>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"
#include "torch/block_kernels.h"
#include "torch/block_redispatch.h"
#include "torch/conv_backward.h"
#include "torch/saved_arguments.h"

namespace cutlassfuse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor or_undefined(const OptionalTensor& t) { return present(t) ? *t : at::Tensor(); }
OptionalTensor or_none(const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

bool requires_grad(const OptionalTensor& t) { return present(t) && t->requires_grad(); }

// The activation as the backward applies it.
struct SavedActivation {
  ActivationKind kind;
  double parameter;
  at::Tensor weight;  // PReLU's, else undefined
};

// norm_activation_backward's results.
struct NormGradients {
  at::Tensor input;  // dz: of the convolution's output (the standalone norm's input)
  at::Tensor gamma, beta, bias, slopes;
};

NormGradients norm_activation_gradients(const at::Tensor& grad, const at::Tensor& y, const at::Tensor& bias,
                                        const at::Tensor& mean, const at::Tensor& rstd, const at::Tensor& gamma,
                                        const at::Tensor& beta, int64_t num_groups, const SavedActivation& act,
                                        bool before_norm) {
  const std::string_view name = activation_name(act.kind);
  auto [dz, dgamma, dbeta, dbias, dslopes] = norm_activation_backward_op().call(
      grad, y, or_none(bias), mean, rstd, or_none(gamma), or_none(beta), num_groups,
      c10::string_view(name.data(), name.size()), act.parameter, or_none(act.weight), before_norm);
  return {std::move(dz), std::move(dgamma), std::move(dbeta), std::move(dbias), std::move(dslopes)};
}

// A parameter's gradient in its dtype, where wanted.
at::Tensor parameter_grad(bool need, const at::Tensor& grad, const at::Tensor& parameter) {
  return need ? grad.to(parameter.scalar_type()) : at::Tensor();
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

// Which of the first `count` saved tensors the call passed (an absent optional is saved
// undefined).
std::vector<bool> given_of(const variable_list& saved, size_t count) {
  std::vector<bool> given(count);
  for (size_t i = 0; i < count; ++i) given[i] = saved[i].defined();
  return given;
}

// needs_input_grad counts the tensors the call passed (absent optionals take no edge).
std::vector<bool> needed(AutogradContext* ctx, const std::vector<bool>& given) {
  std::vector<bool> need(given.size(), false);
  size_t edge = 0;
  for (size_t i = 0; i < given.size(); ++i) {
    if (given[i]) need[i] = ctx->needs_input_grad(edge++);
  }
  return need;
}

// The block call's non-tensor arguments as its backward reads them (saved_arguments.h).
struct SavedBlockArguments {
  SavedConvGeometry conv;
  bool transposed;
  int64_t num_groups;
  double eps;
  ActivationKind activation;
  double activation_parameter;
  bool before_norm, packed_weight_given, residual_given;

  static void save(AutogradContext* ctx, CUTLASSFUSE_BLOCK_PARAMETERS) {
    SavedArgumentsWriter w;
    SavedConvGeometry::write(w, stride, padding, output_padding, dilation, groups);
    for (const bool flag : {transposed, activation_before_norm, present(packed_weight), present(residual)})
      w.add(static_cast<int64_t>(flag));
    w.add(num_groups);
    w.add(static_cast<int64_t>(*activation_from_name(activation)));
    w.add(eps);
    w.add(activation_parameter);
    std::move(w).save(ctx);
  }

  static SavedBlockArguments of(AutogradContext* ctx) {
    SavedArgumentsReader r(ctx);
    SavedBlockArguments a{};
    a.conv = SavedConvGeometry::read(r);
    a.transposed = r.next_int();
    a.before_norm = r.next_int();
    a.packed_weight_given = r.next_int();
    a.residual_given = r.next_int();
    a.num_groups = r.next_int();
    a.activation = static_cast<ActivationKind>(r.next_int());
    a.eps = r.next_double();
    a.activation_parameter = r.next_double();
    return a;
  }

  SavedActivation saved_activation(const at::Tensor& weight) const {
    return {activation, activation_parameter, weight};
  }
};

class ConvNormActivation : public torch::autograd::Function<ConvNormActivation> {
  // Argument positions in the block schema of its tensors. The packed weight takes no
  // gradient, but its edge (where given) comes before the residual's, so it is a slot of
  // its own. The backward reads the tensors before the packed weight; of the packed
  // weight and the residual (whose gradient is the output's) it needs only whether they
  // were given, so neither is saved: the graph does not keep the residual alive.
  enum BlockTensor { kInput, kWeight, kBias, kNormWeight, kNormBias, kSlopes, kPackedWeight, kResidual, kBlockTensors };
  static constexpr int kSavedBlockTensors = kPackedWeight;
  static constexpr int kBlockSchemaArguments = 19;
  static constexpr int kBlockSchemaPosition[kBlockTensors] = {0, 1, 2, 10, 11, 15, 17, 18};

 public:
  static at::Tensor forward(AutogradContext* ctx, CUTLASSFUSE_BLOCK_PARAMETERS) {
    const auto [out, y, mean, rstd] = [&] {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      return block_for_backward_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
    }();
    ctx->save_for_backward({input, weight, or_undefined(bias), or_undefined(norm_weight), or_undefined(norm_bias),
                            or_undefined(activation_weight), y, mean, rstd});
    SavedBlockArguments::save(ctx, CUTLASSFUSE_BLOCK_ARGUMENTS);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const SavedBlockArguments a = SavedBlockArguments::of(ctx);
    std::vector<bool> given = given_of(saved, kSavedBlockTensors);
    given.push_back(a.packed_weight_given);
    given.push_back(a.residual_given);
    const std::vector<bool> need = needed(ctx, given);
    const variable_list inputs(saved.begin(), saved.begin() + kSavedBlockTensors);
    variable_list grads =
        at::GradMode::is_enabled()
            ? differentiable_gradients(recompute(a, inputs), inputs, {need.begin(), need.begin() + kSavedBlockTensors},
                                       grad_outputs[0])
            : gradients(a, saved, need, grad_outputs[0]);
    grads.resize(kBlockTensors);
    grads[kResidual] = need[kResidual] ? grad_outputs[0] : at::Tensor();
    variable_list schema_grads(kBlockSchemaArguments);
    for (int i = 0; i < kBlockTensors; ++i) schema_grads[kBlockSchemaPosition[i]] = grads[i];
    return schema_grads;
  }

 private:
  static variable_list gradients(const SavedBlockArguments& a, const variable_list& saved,
                                 const std::vector<bool>& need, const at::Tensor& grad) {
    const at::Tensor &input = saved[kInput], &weight = saved[kWeight];
    NormGradients g = norm_activation_gradients(
        grad, saved[kSavedBlockTensors], saved[kBias], saved[kSavedBlockTensors + 1], saved[kSavedBlockTensors + 2],
        saved[kNormWeight], saved[kNormBias], a.num_groups, a.saved_activation(saved[kSlopes]), a.before_norm);
    variable_list grads(kSavedBlockTensors);
    if (need[kInput] || need[kWeight]) {
      // ATen's gradients only: the CUTLASS conv-gradient kernels' rule was measured on the
      // original op's layers.
      std::tie(grads[kInput], grads[kWeight]) =
          convolution_backward(std::move(g.input), input, weight, a.conv.geometry(), a.transposed,
                               {need[kInput], need[kWeight]}, /*cutlass_kernels=*/false);
    }
    grads[kBias] = parameter_grad(need[kBias], g.bias, saved[kBias]);
    grads[kNormWeight] = parameter_grad(need[kNormWeight], g.gamma, saved[kNormWeight]);
    grads[kNormBias] = parameter_grad(need[kNormBias], g.beta, saved[kNormBias]);
    grads[kSlopes] = parameter_grad(need[kSlopes], g.slopes, saved[kSlopes]);
    return grads;
  }

  static at::Tensor recompute(const SavedBlockArguments& a, const variable_list& t) {
    const SavedConvGeometry& g = a.conv;
    at::Tensor x = at::convolution(t[kInput], t[kWeight], or_none(t[kBias]), g.stride, g.padding, g.dilation,
                                   a.transposed, g.output_padding, g.groups);
    if (a.before_norm) x = apply_activation(x, a.activation, a.activation_parameter, or_none(t[kSlopes]));
    const at::ScalarType type = x.scalar_type();
    x = at::group_norm(x, a.num_groups, as_type(or_none(t[kNormWeight]), type), as_type(or_none(t[kNormBias]), type),
                       a.eps);
    return a.before_norm ? x : apply_activation(x, a.activation, a.activation_parameter, or_none(t[kSlopes]));
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
    SavedArgumentsWriter w;
    w.add(num_groups);
    w.add(static_cast<int64_t>(*activation_from_name(activation)));
    w.add(eps);
    w.add(activation_parameter);
    std::move(w).save(ctx);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::vector<bool> need = needed(ctx, given_of(saved, kNormTensors));
    const variable_list inputs(saved.begin(), saved.begin() + kNormTensors);
    SavedArgumentsReader r(ctx);
    const int64_t num_groups = r.next_int();
    const auto kind = static_cast<ActivationKind>(r.next_int());
    const double eps = r.next_double(), parameter = r.next_double();
    variable_list grads(kNormTensors);
    if (at::GradMode::is_enabled()) {
      const at::Tensor& x = inputs[kNormInput];
      const at::ScalarType type = x.scalar_type();
      const at::Tensor out = apply_activation(at::group_norm(x, num_groups, as_type(or_none(inputs[kGamma]), type),
                                                             as_type(or_none(inputs[kBeta]), type), eps),
                                              kind, parameter, or_none(inputs[kNormSlopes]));
      grads = differentiable_gradients(out, inputs, need, grad_outputs[0]);
    } else {
      NormGradients g = norm_activation_gradients(
          grad_outputs[0], saved[kNormInput], at::Tensor(), saved[kNormTensors], saved[kNormTensors + 1], saved[kGamma],
          saved[kBeta], num_groups, SavedActivation{kind, parameter, saved[kNormSlopes]}, /*before_norm=*/false);
      if (need[kNormInput]) grads[kNormInput] = g.input;
      grads[kGamma] = parameter_grad(need[kGamma], g.gamma, saved[kGamma]);
      grads[kBeta] = parameter_grad(need[kBeta], g.beta, saved[kBeta]);
      grads[kNormSlopes] = parameter_grad(need[kNormSlopes], g.slopes, saved[kNormSlopes]);
    }
    variable_list schema_grads(kNormSchemaArguments);
    for (int i = 0; i < kNormTensors; ++i) schema_grads[kNormSchemaPosition[i]] = grads[i];
    return schema_grads;
  }
};

}  // namespace

at::Tensor conv3d_norm_activation_autograd(CUTLASSFUSE_BLOCK_PARAMETERS) {
  const bool tracked =
      at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(norm_weight) ||
       requires_grad(norm_bias) || requires_grad(activation_weight) || requires_grad(residual));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return block_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
  }
  return ConvNormActivation::apply(CUTLASSFUSE_BLOCK_ARGUMENTS);
}

at::Tensor group_norm_activation_autograd(CUTLASSFUSE_NORM_PARAMETERS) {
  const bool tracked = at::GradMode::is_enabled() && (input.requires_grad() || requires_grad(norm_weight) ||
                                                      requires_grad(norm_bias) || requires_grad(activation_weight));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return norm_op().call(CUTLASSFUSE_NORM_ARGUMENTS);
  }
  return GroupNormActivation::apply(CUTLASSFUSE_NORM_ARGUMENTS);
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("conv3d_norm_activation", &conv3d_norm_activation_autograd);
  m.impl("group_norm_activation", &group_norm_activation_autograd);
}

}  // namespace cutlassfuse
