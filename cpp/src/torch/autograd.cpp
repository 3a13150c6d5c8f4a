// The op's backward, registered at the Autograd key in C++.
//
// In C++ rather than with torch.library.register_autograd: a Python autograd kernel
// runs on every call, gradients wanted or not, and converts the op's 14 arguments to
// Python objects and back (a few microseconds per call; small-shape calls are bound by
// the host). Here a call that needs no gradient costs one redispatch.
//
// What is saved: the op's inputs only. Backward recomputes the pre-norm activation
// y = ReLU(ConvTranspose3d(x)) with one deconvolution instead of keeping it alive from
// forward to backward (for KernelBench level2/61 in fp16 that tensor is 161 MB per
// call, as large as the output). Everything is ATen ops on symbolic sizes, so AOT
// autograd traces it for torch.compile and torch.export. Under create_graph the
// gradients are themselves differentiable (differentiable_backward).
#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <array>

#include "torch/redispatch.h"

namespace cutlassfuse {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_below_autograd(const at::Tensor& input, const at::Tensor& weight, const OptionalTensor& bias,
                               const OptionalTensor& norm_weight, const OptionalTensor& norm_bias, int64_t num_groups,
                               double eps, at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,
                               const OptionalTensor& packed_weight, const OptionalTensor& packed_bias) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return fused_op().call(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding, output_padding,
                         groups, dilation, packed_weight, packed_bias);
}

// The differentiable inputs, in the op's order; packed_weight and packed_bias are
// detached copies of the weight's and the bias's layouts, never differentiated.
enum Differentiable { kInput, kWeight, kBias, kNormWeight, kNormBias, kDifferentiable };
// Backward returns one gradient per argument of the schema (registration.cpp).
constexpr int kOpArguments = 14;

class ConvTransposeReluGroupNorm : public torch::autograd::Function<ConvTransposeReluGroupNorm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                            const OptionalTensor& bias, const OptionalTensor& norm_weight,
                            const OptionalTensor& norm_bias, int64_t num_groups, double eps, at::IntArrayRef stride,
                            at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                            at::IntArrayRef dilation, const OptionalTensor& packed_weight,
                            const OptionalTensor& packed_bias) {
    at::Tensor out = call_below_autograd(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                                         output_padding, groups, dilation, packed_weight, packed_bias);
    auto or_undefined = [](const OptionalTensor& t) { return present(t) ? *t : at::Tensor(); };
    ctx->save_for_backward({input, weight, or_undefined(bias), or_undefined(norm_weight), or_undefined(norm_bias)});
    ctx->saved_data["num_groups"] = num_groups;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["stride"] = stride.vec();
    ctx->saved_data["padding"] = padding.vec();
    ctx->saved_data["output_padding"] = output_padding.vec();
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["dilation"] = dilation.vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const std::array<bool, kDifferentiable> need = needed_gradients(ctx, saved);
    // Grad mode is on here only under create_graph (double backward).
    if (at::GradMode::is_enabled()) return differentiable_backward(ctx, saved, need, grad_outputs[0]);
    const at::Tensor &input = saved[kInput], &weight = saved[kWeight], &bias = saved[kBias];
    const at::Tensor &norm_weight = saved[kNormWeight], &norm_bias = saved[kNormBias];
    const auto ints = [&](const char* key) { return ctx->saved_data[key].toIntVector(); };
    const std::vector<int64_t> stride = ints("stride"), padding = ints("padding"),
                               output_padding = ints("output_padding"), dilation = ints("dilation");
    const int64_t groups = ctx->saved_data["groups"].toInt();
    const int64_t num_groups = ctx->saved_data["num_groups"].toInt();

    const at::Tensor y =
        at::relu(at::conv_transpose3d(input, weight, bias, stride, padding, output_padding, groups, dilation));
    const c10::SymInt n = y.sym_size(0), c = y.sym_size(1), spatial = y.sym_numel() / (n * c);
    const OptionalTensor gamma = norm_weight.defined() ? OptionalTensor(norm_weight.to(y.scalar_type())) : std::nullopt;
    // ATen's GroupNorm kernels accumulate statistics and gradients in fp32 inside the
    // kernels, with no full-size fp32 temporaries.
    const double eps = ctx->saved_data["eps"].toDouble();
    const auto [unused_output, mean, rstd] =
        at::native_group_norm_symint(y, gamma, std::nullopt, n, c, spatial, num_groups, eps);
    const auto [dy, dgamma, dbeta] = at::native_group_norm_backward_symint(
        grad_outputs[0].contiguous(y.suggest_memory_format()), y, mean, rstd, gamma, n, c, spatial, num_groups,
        {true, need[kNormWeight], need[kNormBias]});
    // ReLU passes the gradient where its output is positive.
    const at::Tensor da = at::threshold_backward(dy, y, 0);
    const std::vector<c10::SymInt> bias_sizes{bias.defined() ? bias.sym_size(0) : c10::SymInt(0)};
    const auto [grad_input, grad_weight, grad_bias] = at::convolution_backward_symint(
        da, input, weight, bias.defined() ? at::OptionalSymIntArrayRef(bias_sizes) : std::nullopt,
        c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding), c10::fromIntArrayRefSlow(dilation),
        /*transposed=*/true, c10::fromIntArrayRefSlow(output_padding), groups,
        {need[kInput], need[kWeight], need[kBias]});

    variable_list grads(kOpArguments);  // the non-tensor arguments and the packed copies get none
    grads[kInput] = grad_input;
    grads[kWeight] = grad_weight;
    grads[kBias] = grad_bias;
    if (need[kNormWeight]) grads[kNormWeight] = dgamma.to(norm_weight.scalar_type());
    if (need[kNormBias]) grads[kNormBias] = dbeta.to(norm_bias.scalar_type());
    return grads;
  }

 private:
  // The gradients as a graph of their own: the block recomputed with ATen's
  // differentiable ops from the saved inputs, and differentiated by autograd with
  // create_graph, so that a second backward runs through it (ATen's GroupNorm backward
  // kernel has no derivative of its own).
  static variable_list differentiable_backward(AutogradContext* ctx, const variable_list& saved,
                                               const std::array<bool, kDifferentiable>& need, const at::Tensor& grad) {
    const auto ints = [&](const char* key) { return ctx->saved_data[key].toIntVector(); };
    const at::Tensor& bias = saved[kBias];
    const at::Tensor& norm_weight = saved[kNormWeight];
    const at::Tensor& norm_bias = saved[kNormBias];
    const at::Tensor y = at::group_norm(
        at::relu(at::conv_transpose3d(saved[kInput], saved[kWeight], bias, ints("stride"), ints("padding"),
                                      ints("output_padding"), ctx->saved_data["groups"].toInt(), ints("dilation"))),
        ctx->saved_data["num_groups"].toInt(), norm_weight, norm_bias, ctx->saved_data["eps"].toDouble());
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

at::Tensor forward_autograd(const at::Tensor& input, const at::Tensor& weight, const OptionalTensor& bias,
                            const OptionalTensor& norm_weight, const OptionalTensor& norm_bias, int64_t num_groups,
                            double eps, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                            int64_t groups, at::IntArrayRef dilation, const OptionalTensor& packed_weight,
                            const OptionalTensor& packed_bias) {
  const bool tracked =
      at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad() || (present(bias) && bias->requires_grad()) ||
       (present(norm_weight) && norm_weight->requires_grad()) || (present(norm_bias) && norm_bias->requires_grad()));
  if (!tracked) {
    return call_below_autograd(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride, padding,
                               output_padding, groups, dilation, packed_weight, packed_bias);
  }
  return ConvTransposeReluGroupNorm::apply(input, weight, bias, norm_weight, norm_bias, num_groups, eps, stride,
                                           padding, output_padding, groups, dilation, packed_weight, packed_bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) { m.impl("conv_transpose3d_relu_group_norm", &forward_autograd); }

}  // namespace cutlassfuse
