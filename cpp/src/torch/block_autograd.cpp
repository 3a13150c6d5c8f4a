// The block family's backward, registered at the Autograd key in C++ (a call that needs
// no gradient costs one redispatch, one that does builds its backward node directly; see
// autograd.cpp and autograd_node.h).
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

#include <array>
#include <string_view>
#include <utility>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"
#include "torch/autograd_node.h"
#include "torch/block_kernels.h"
#include "torch/block_redispatch.h"
#include "torch/conv_backward.h"

namespace cutlassfuse {
namespace {

using torch::autograd::variable_list;

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

// The block op's tensors that take a gradient, in its schema's order: one edge each (an
// absent optional's is invalid). The packed weight is a detached copy of the weight's
// layout and takes none. The residual's gradient is the output's, so the residual is not
// saved: the graph does not keep it alive.
enum BlockEdge { kInput, kWeight, kBias, kNormWeight, kNormBias, kSlopes, kResidual, kBlockEdges };
constexpr int kSavedBlockInputs = kResidual;

// The block op's backward node. Saved: the inputs, and what the forward that keeps them
// returns (block.h): the convolution's output y without its bias (kept), and the norm's
// mean and rstd.
struct ConvNormActivationBackward final : SavingNode<kSavedBlockInputs> {
  SavedConvGeometry conv;
  int64_t num_groups = 1;
  bool transposed = false, before_norm = false;
  double eps = 0, activation_parameter = 0;
  ActivationKind activation = ActivationKind::kIdentity;

  std::string name() const override { return "ConvNormActivationBackward"; }

  variable_list input_gradients(const at::Tensor& grad, const variable_list& saved,
                                const std::vector<bool>& need) override {
    // Grad mode is on here only under create_graph (double backward).
    variable_list result =
        at::GradMode::is_enabled()
            ? differentiable_gradients(recompute(saved), saved, {need.begin(), need.begin() + kSavedBlockInputs}, grad)
            : gradients(saved, need, grad);
    result.resize(kBlockEdges);
    if (need[kResidual]) result[kResidual] = grad;
    return result;
  }

 private:
  variable_list gradients(const variable_list& saved, const std::vector<bool>& need, const at::Tensor& grad) const {
    NormGradients g = norm_activation_gradients(grad, kept.unpack(), saved[kBias], mean.unpack(), rstd.unpack(),
                                                saved[kNormWeight], saved[kNormBias], num_groups,
                                                {activation, activation_parameter, saved[kSlopes]}, before_norm);
    variable_list result(kSavedBlockInputs);
    if (need[kInput] || need[kWeight]) {
      // ATen's gradients only: the CUTLASS conv-gradient kernels' rule was measured on the
      // original op's layers.
      std::tie(result[kInput], result[kWeight]) =
          convolution_backward(std::move(g.input), saved[kInput], saved[kWeight], conv.geometry(), transposed,
                               {need[kInput], need[kWeight]}, /*cutlass_kernels=*/false);
    }
    result[kBias] = parameter_grad(need[kBias], g.bias, saved[kBias]);
    result[kNormWeight] = parameter_grad(need[kNormWeight], g.gamma, saved[kNormWeight]);
    result[kNormBias] = parameter_grad(need[kNormBias], g.beta, saved[kNormBias]);
    result[kSlopes] = parameter_grad(need[kSlopes], g.slopes, saved[kSlopes]);
    return result;
  }

  // The block with ATen's differentiable ops, from the saved inputs.
  at::Tensor recompute(const variable_list& t) const {
    at::Tensor x = at::convolution(t[kInput], t[kWeight], or_none(t[kBias]), conv.stride, conv.padding, conv.dilation,
                                   transposed, conv.output_padding, conv.groups);
    if (before_norm) x = apply_activation(x, activation, activation_parameter, or_none(t[kSlopes]));
    const at::ScalarType type = x.scalar_type();
    x = at::group_norm(x, num_groups, as_type(or_none(t[kNormWeight]), type), as_type(or_none(t[kNormBias]), type),
                       eps);
    return before_norm ? x : apply_activation(x, activation, activation_parameter, or_none(t[kSlopes]));
  }
};

// The standalone norm op's tensors that take a gradient, in its schema's order.
enum NormEdge { kNormInput, kGamma, kBeta, kNormSlopes, kNormEdges };

// The standalone norm's backward node. Saved: the inputs, the norm's mean and rstd.
struct GroupNormActivationBackward final : SavingNode<kNormEdges> {
  int64_t num_groups = 1;
  double eps = 0, activation_parameter = 0;
  ActivationKind activation = ActivationKind::kIdentity;

  std::string name() const override { return "GroupNormActivationBackward"; }

  variable_list input_gradients(const at::Tensor& grad, const variable_list& saved,
                                const std::vector<bool>& need) override {
    if (at::GradMode::is_enabled()) {
      const at::Tensor& x = saved[kNormInput];
      const at::ScalarType type = x.scalar_type();
      const at::Tensor out = apply_activation(at::group_norm(x, num_groups, as_type(or_none(saved[kGamma]), type),
                                                             as_type(or_none(saved[kBeta]), type), eps),
                                              activation, activation_parameter, or_none(saved[kNormSlopes]));
      return differentiable_gradients(out, saved, need, grad);
    }
    NormGradients g =
        norm_activation_gradients(grad, saved[kNormInput], at::Tensor(), mean.unpack(), rstd.unpack(), saved[kGamma],
                                  saved[kBeta], num_groups, {activation, activation_parameter, saved[kNormSlopes]},
                                  /*before_norm=*/false);
    variable_list result(kNormEdges);
    if (need[kNormInput]) result[kNormInput] = g.input;
    result[kGamma] = parameter_grad(need[kGamma], g.gamma, saved[kGamma]);
    result[kBeta] = parameter_grad(need[kBeta], g.beta, saved[kBeta]);
    result[kNormSlopes] = parameter_grad(need[kNormSlopes], g.slopes, saved[kNormSlopes]);
    return result;
  }
};

// The forwards that keep what the backwards read, through the dispatcher below autograd.
BlockForBackward redispatched_block_for_backward(CUTLASSFUSE_BLOCK_PARAMETERS) {
  return block_for_backward_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
}

NormForBackward redispatched_norm_for_backward(CUTLASSFUSE_NORM_PARAMETERS) {
  return norm_for_backward_op().call(CUTLASSFUSE_NORM_ARGUMENTS);
}

// The block call recorded for its backward: the forward that keeps what the backward
// reads, then the node, its edges and the output's history.
template <BlockForBackwardSignature* Forward>
at::Tensor record_block(CUTLASSFUSE_BLOCK_PARAMETERS) {
  check_no_forward_gradients("conv3d_norm_activation", input, weight, bias, norm_weight, norm_bias, activation_weight,
                             residual);
  auto [out, y, mean, rstd] = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return Forward(CUTLASSFUSE_BLOCK_ARGUMENTS);
  }();
  record_node<ConvNormActivationBackward>(
      out,
      [&](ConvNormActivationBackward& n) {
        const std::array<at::Tensor, kSavedBlockInputs> saved{input,
                                                              weight,
                                                              or_undefined(bias),
                                                              or_undefined(norm_weight),
                                                              or_undefined(norm_bias),
                                                              or_undefined(activation_weight)};
        n.save(saved, y, mean, rstd);
        n.conv.save(stride, padding, output_padding, dilation, groups);
        n.transposed = transposed;
        n.num_groups = num_groups;
        n.eps = eps;
        n.activation = *activation_from_name(activation);
        n.activation_parameter = activation_parameter;
        n.before_norm = activation_before_norm;
      },
      input, weight, bias, norm_weight, norm_bias, activation_weight, residual);
  return out;
}

// The standalone norm's call recorded for its backward.
template <NormForBackwardSignature* Forward>
at::Tensor record_norm(CUTLASSFUSE_NORM_PARAMETERS) {
  check_no_forward_gradients("group_norm_activation", input, norm_weight, norm_bias, activation_weight);
  auto [out, mean, rstd] = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return Forward(CUTLASSFUSE_NORM_ARGUMENTS);
  }();
  record_node<GroupNormActivationBackward>(
      out,
      [&](GroupNormActivationBackward& n) {
        const std::array<at::Tensor, kNormEdges> saved{input, or_undefined(norm_weight), or_undefined(norm_bias),
                                                       or_undefined(activation_weight)};
        n.save(saved, at::Tensor(), mean, rstd);
        n.num_groups = num_groups;
        n.eps = eps;
        n.activation = *activation_from_name(activation);
        n.activation_parameter = activation_parameter;
      },
      input, norm_weight, norm_bias, activation_weight);
  return out;
}

template <BlockForBackwardSignature* Forward>
at::Tensor block_autograd_kernel(CUTLASSFUSE_BLOCK_PARAMETERS) {
  const bool tracked =
      at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad() || requires_grad(bias) || requires_grad(norm_weight) ||
       requires_grad(norm_bias) || requires_grad(activation_weight) || requires_grad(residual));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return block_op().call(CUTLASSFUSE_BLOCK_ARGUMENTS);
  }
  return record_block<Forward>(CUTLASSFUSE_BLOCK_ARGUMENTS);
}

template <NormForBackwardSignature* Forward>
at::Tensor norm_autograd_kernel(CUTLASSFUSE_NORM_PARAMETERS) {
  const bool tracked = at::GradMode::is_enabled() && (input.requires_grad() || requires_grad(norm_weight) ||
                                                      requires_grad(norm_bias) || requires_grad(activation_weight));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return norm_op().call(CUTLASSFUSE_NORM_ARGUMENTS);
  }
  return record_norm<Forward>(CUTLASSFUSE_NORM_ARGUMENTS);
}

}  // namespace

#if CUTLASSFUSE_WITH_CUDA
at::Tensor conv3d_norm_activation_autograd_cuda(CUTLASSFUSE_BLOCK_PARAMETERS) {
  return block_autograd_kernel<&block_kernel<BlockForBackward, &block_forward_for_backward_cuda>>(
      CUTLASSFUSE_BLOCK_ARGUMENTS);
}

at::Tensor group_norm_activation_autograd_cuda(CUTLASSFUSE_NORM_PARAMETERS) {
  return norm_autograd_kernel<&norm_kernel<NormForBackward, &norm_activation_forward_for_backward_cuda>>(
      CUTLASSFUSE_NORM_ARGUMENTS);
}
#endif

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("conv3d_norm_activation", &block_autograd_kernel<&redispatched_block_for_backward>);
  m.impl("group_norm_activation", &norm_autograd_kernel<&redispatched_norm_for_backward>);
}

}  // namespace cutlassfuse
