// The op's backward, registered at the Autograd key in C++.
//
// In C++ rather than with torch.library.register_autograd: a Python autograd kernel
// runs on every call, gradients wanted or not, and converts the op's 14 arguments to
// Python objects and back (a few microseconds per call; small-shape calls are bound by
// the host). Here a call that needs no gradient costs one redispatch.
//
// What is saved: what eager's modules keep, the activation a = ReLU(ConvTranspose3d(x))
// and GroupNorm's per-(sample, group) mean and rstd, returned by the forward that
// computes the output (conv_transpose3d_relu_group_norm_for_backward); calls that need
// no gradient keep nothing. A CUDA call that runs the fallback whatever its sizes keeps
// the convolution's output without bias instead, which its kernels write anyway, and one
// the fused path runs as its pixel-shuffle GEMM the activation in that GEMM's order
// (kept_for_backward, op.h): the activation in pixel order would be one more write of the
// output's size. Backward: the ReLU + GroupNorm backward op (of the activation in either
// order) or the block family's
// norm_activation_backward (ReLU(y + bias) recomputed from the convolution's output), then the
// convolution's gradients (conv_backward.h: this project's CUTLASS kernels or ATen's
// convolution_backward, per gradient). Under create_graph the gradients are themselves differentiable
// (differentiable_backward). Everything is ops on symbolic sizes, so AOT autograd
// traces it for torch.compile and torch.export.
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>

#include "torch/block_redispatch.h"
#include "torch/conv_backward.h"
#include "torch/op_kernels.h"
#include "torch/redispatch.h"
#include "torch/saved_arguments.h"

namespace cutlassfuse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The differentiable inputs, in the op's order; packed_weight and packed_bias are
// detached copies of the weight's and the bias's layouts, never differentiated. Then
// what the forward kept.
enum Saved { kInput, kWeight, kBias, kNormWeight, kNormBias, kDifferentiable, kKept = kDifferentiable, kMean, kRstd };
// Backward returns one gradient per argument of the schema (registration.cpp).
constexpr int kOpArguments = 14;

// The call's non-tensor arguments as the backward reads them (saved_arguments.h).
struct SavedArguments {
  SavedConvGeometry conv;
  KeptTensor kept;
  int64_t num_groups;
  double eps;

  static SavedArguments of(AutogradContext* ctx) {
    SavedArgumentsReader r(ctx);
    SavedArguments a{};
    a.conv = SavedConvGeometry::read(r);
    a.kept = static_cast<KeptTensor>(r.next_int());
    a.num_groups = r.next_int();
    a.eps = r.next_double();
    return a;
  }
};

class ConvTransposeReluGroupNorm : public torch::autograd::Function<ConvTransposeReluGroupNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const OptionalTensor& bias, const OptionalTensor& norm_weight,
                            const OptionalTensor& norm_bias, int64_t num_groups, double eps, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                            at::IntArrayRef dilation, const OptionalTensor& packed_weight,
                            const OptionalTensor& packed_bias) {
    const KeptTensor kept_tensor =
        kept_for_backward({input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                           output_padding, groups, dilation, packed_weight, packed_bias});
    const auto [out, kept, mean, rstd] = [&] {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      return for_backward_op().call(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                                    output_padding, groups, dilation, packed_weight, packed_bias,
                                    kept_tensor == KeptTensor::kConvOutput,
                                    kept_tensor == KeptTensor::kActivationSpaceToDepth);
    }();
    auto or_undefined = [](const OptionalTensor& t) { return present(t) ? *t : at::Tensor(); };
    ctx->save_for_backward(
        {input, weight, or_undefined(bias), or_undefined(norm_weight), or_undefined(norm_bias), kept, mean, rstd});
    SavedArgumentsWriter w;
    SavedConvGeometry::write(w, stride, padding, output_padding, dilation, groups);
    w.add(static_cast<int64_t>(kept_tensor));
    w.add(num_groups);
    w.add(eps);
    std::move(w).save(ctx);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::array<bool, kDifferentiable> need = needed_gradients(ctx, saved);
    // Grad mode is on here only under create_graph (double backward).
    if (at::GradMode::is_enabled()) return differentiable_backward(ctx, saved, need, grad_outputs[0]);
    const at::Tensor &input = saved[kInput], &weight = saved[kWeight], &bias = saved[kBias];
    const at::Tensor &norm_weight = saved[kNormWeight], &norm_bias = saved[kNormBias];
    const SavedArguments a = SavedArguments::of(ctx);
    auto [dz, dgamma, dbeta, dbias] = norm_backward(grad_outputs[0], saved, a.kept, a.num_groups);
    at::Tensor grad_input, grad_weight;
    if (need[kInput] || need[kWeight]) {
      std::tie(grad_input, grad_weight) =
          convolution_backward(std::move(dz), input, weight, a.conv.geometry(),
                               /*transposed=*/true, {need[kInput], need[kWeight]}, /*cutlass_kernels=*/true);
    }

    variable_list grads(kOpArguments);  // the non-tensor arguments and the packed copies get none
    grads[kInput] = grad_input;
    grads[kWeight] = grad_weight;
    if (need[kBias]) grads[kBias] = dbias.to(bias.scalar_type());
    if (need[kNormWeight]) grads[kNormWeight] = dgamma.to(norm_weight.scalar_type());
    if (need[kNormBias]) grads[kNormBias] = dbeta.to(norm_bias.scalar_type());
    return grads;
  }

 private:
  // The gradients of the convolution's output z (with bias), gamma, beta and the bias,
  // from what the forward kept: the activation, or the convolution's output y from which
  // the family's backward recomputes ReLU(y + bias).
  static Tensors4 norm_backward(const at::Tensor& grad, const variable_list& saved, KeptTensor kept,
                                int64_t num_groups) {
    auto optional = [](const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
    if (kept != KeptTensor::kConvOutput) {
      return relu_group_norm_backward_op().call(grad, saved[kKept], saved[kMean], saved[kRstd],
                                                optional(saved[kNormWeight]), num_groups);
    }
    auto [dz, dgamma, dbeta, dbias, dslopes] = norm_activation_backward_op().call(
        grad, saved[kKept], optional(saved[kBias]), saved[kMean], saved[kRstd], optional(saved[kNormWeight]),
        optional(saved[kNormBias]), num_groups, "relu", 0.0, std::nullopt, /*activation_before_norm=*/true);
    return {std::move(dz), std::move(dgamma), std::move(dbeta), std::move(dbias)};
  }

  // The gradients as a graph of their own: the block recomputed with ATen's
  // differentiable ops from the saved inputs, and differentiated by autograd with
  // create_graph, so that a second backward runs through it (ATen's GroupNorm backward
  // kernel has no derivative of its own).
  static variable_list differentiable_backward(AutogradContext* ctx, const variable_list& saved,
                                               const std::array<bool, kDifferentiable>& need, const at::Tensor& grad) {
    const SavedArguments a = SavedArguments::of(ctx);
    const SavedConvGeometry& g = a.conv;
    const at::Tensor& bias = saved[kBias];
    const at::Tensor& norm_weight = saved[kNormWeight];
    const at::Tensor& norm_bias = saved[kNormBias];
    const at::Tensor y =
        at::group_norm(at::relu(at::conv_transpose3d(saved[kInput], saved[kWeight], bias, g.stride, g.padding,
                                                     g.output_padding, g.groups, g.dilation)),
                       a.num_groups, norm_weight, norm_bias, a.eps);
    variable_list wanted;
    for (int i = 0; i < kDifferentiable; ++i) {
      if (need[i]) wanted.push_back(saved[i]);
    }
    const variable_list found = torch::autograd::grad({y}, wanted, {grad}, /*retain_graph=*/true,
                                                      /*create_graph=*/true, /*allow_unused=*/true);
    variable_list grads(kOpArguments);
    for (int i = 0, next = 0; i < kDifferentiable; ++i) {
      if (need[i]) grads[i] = found[next++];
    }
    return grads;
  }

  // needs_input_grad counts the tensors the call passed (absent optionals take no
  // edge): map them back to the op's argument positions.
  static std::array<bool, kDifferentiable> needed_gradients(AutogradContext* ctx, const variable_list& saved) {
    std::array<bool, kDifferentiable> need{};
    size_t edge = 0;
    for (int i = 0; i < kDifferentiable; ++i) {
      if (saved[i].defined()) need[i] = ctx->needs_input_grad(edge++);
    }
    return need;
  }
};

}  // namespace

at::Tensor conv_transpose3d_relu_group_norm_autograd(CUTLASSFUSE_OP_PARAMETERS) {
  const bool tracked =
      at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad() || (present(bias) && bias->requires_grad()) ||
       (present(norm_weight) && norm_weight->requires_grad()) || (present(norm_bias) && norm_bias->requires_grad()));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fused_op().call(CUTLASSFUSE_OP_ARGUMENTS);
  }
  return ConvTransposeReluGroupNorm::apply(CUTLASSFUSE_OP_ARGUMENTS);
}

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("conv_transpose3d_relu_group_norm", &conv_transpose3d_relu_group_norm_autograd);
}

}  // namespace cutlassfuse
