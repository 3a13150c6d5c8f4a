// The op's backward, registered at the Autograd key in C++.
//
// In C++ rather than with torch.library.register_autograd: a Python autograd kernel
// runs on every call, gradients wanted or not, and converts the op's 14 arguments to
// Python objects and back (a few microseconds per call; small-shape calls are bound by
// the host). Here a call that needs no gradient costs one redispatch, and one that does
// builds its backward node directly (autograd_node.h).
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

#include "torch/autograd_node.h"
#include "torch/block_redispatch.h"
#include "torch/conv_backward.h"
#include "torch/op_kernels.h"
#include "torch/redispatch.h"

namespace cutlassfuse {
namespace {

using torch::autograd::variable_list;

// The differentiable inputs, in the op's order, one edge each (an absent optional's is
// invalid); packed_weight and packed_bias are detached copies of the weight's and the
// bias's layouts, never differentiated.
enum Input { kInput, kWeight, kBias, kNormWeight, kNormBias, kDifferentiable };

// The op's backward node: the inputs and what the forward kept (activation, mean and
// rstd; op.h, KeptTensor), the convolution's geometry, the GroupNorm's arguments.
struct ConvTransposeReluGroupNormBackward final : SavingNode<kDifferentiable> {
  SavedConvGeometry conv;
  int64_t num_groups = 1;
  double eps = 0;
  KeptTensor kept_tensor = KeptTensor::kActivation;

  std::string name() const override { return "ConvTransposeReluGroupNormBackward"; }

  variable_list input_gradients(const at::Tensor& grad, const variable_list& saved,
                                const std::vector<bool>& need) override {
    // Grad mode is on here only under create_graph (double backward).
    if (at::GradMode::is_enabled()) return differentiable_gradients(recompute(saved), saved, need, grad);
    auto [dz, dgamma, dbeta, dbias] = norm_backward(grad, saved);
    variable_list result(kDifferentiable);
    if (need[kInput] || need[kWeight]) {
      std::tie(result[kInput], result[kWeight]) =
          convolution_backward(std::move(dz), saved[kInput], saved[kWeight], conv.geometry(), /*transposed=*/true,
                               {need[kInput], need[kWeight]},
                               /*cutlass_kernels=*/true);
    }
    if (need[kBias]) result[kBias] = dbias.to(saved[kBias].scalar_type());
    if (need[kNormWeight]) result[kNormWeight] = dgamma.to(saved[kNormWeight].scalar_type());
    if (need[kNormBias]) result[kNormBias] = dbeta.to(saved[kNormBias].scalar_type());
    return result;
  }

 private:
  // The gradients of the convolution's output z (with bias), gamma, beta and the bias,
  // from what the forward kept: the activation, or the convolution's output y from which
  // the family's backward recomputes ReLU(y + bias).
  Tensors4 norm_backward(const at::Tensor& grad, const variable_list& saved) const {
    auto optional = [](const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; };
    if (kept_tensor != KeptTensor::kConvOutput) {
      return relu_group_norm_backward_op().call(grad, kept.unpack(), mean.unpack(), rstd.unpack(),
                                                optional(saved[kNormWeight]), num_groups);
    }
    auto [dz, dgamma, dbeta, dbias, dslopes] = norm_activation_backward_op().call(
        grad, kept.unpack(), optional(saved[kBias]), mean.unpack(), rstd.unpack(), optional(saved[kNormWeight]),
        optional(saved[kNormBias]), num_groups, "relu", 0.0, std::nullopt, /*activation_before_norm=*/true);
    return {std::move(dz), std::move(dgamma), std::move(dbeta), std::move(dbias)};
  }

  // The block recomputed with ATen's differentiable ops from the saved inputs (ATen's
  // GroupNorm backward kernel has no derivative of its own).
  at::Tensor recompute(const variable_list& saved) const {
    return at::group_norm(at::relu(at::conv_transpose3d(saved[kInput], saved[kWeight], saved[kBias], conv.stride,
                                                        conv.padding, conv.output_padding, conv.groups, conv.dilation)),
                          num_groups, saved[kNormWeight], saved[kNormBias], eps);
  }
};

// The forward that keeps what the backward reads, through the dispatcher below autograd.
ForwardForBackward redispatched_for_backward(CUTLASSFUSE_OP_PARAMETERS, bool keep_conv_output,
                                             bool keep_space_to_depth) {
  return for_backward_op().call(CUTLASSFUSE_OP_ARGUMENTS, keep_conv_output, keep_space_to_depth);
}

// The call recorded for its backward: the forward that keeps what the backward reads,
// then the node, its edges and the output's history.
template <ForBackwardSignature* Forward>
at::Tensor forward_recorded(CUTLASSFUSE_OP_PARAMETERS) {
  check_no_forward_gradients("conv_transpose3d_relu_group_norm", input, weight, bias, norm_weight, norm_bias);
  const KeptTensor kept_tensor = kept_for_backward({CUTLASSFUSE_OP_ARGUMENTS});
  auto [out, kept, mean, rstd] = [&] {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return Forward(CUTLASSFUSE_OP_ARGUMENTS, kept_tensor == KeptTensor::kConvOutput,
                   kept_tensor == KeptTensor::kActivationSpaceToDepth);
  }();
  const std::array<at::Tensor, kDifferentiable> differentiable{input, weight, or_undefined(bias),
                                                               or_undefined(norm_weight), or_undefined(norm_bias)};
  record_node<ConvTransposeReluGroupNormBackward>(
      out,
      [&](ConvTransposeReluGroupNormBackward& n) {
        n.save(differentiable, kept, mean, rstd);
        n.conv.save(stride, padding, output_padding, dilation, groups);
        n.num_groups = num_groups;
        n.eps = eps;
        n.kept_tensor = kept_tensor;
      },
      differentiable[kInput], differentiable[kWeight], differentiable[kBias], differentiable[kNormWeight],
      differentiable[kNormBias]);
  return out;
}

template <ForBackwardSignature* Forward>
at::Tensor autograd_kernel(CUTLASSFUSE_OP_PARAMETERS) {
  const bool tracked =
      at::GradMode::is_enabled() &&
      (input.requires_grad() || weight.requires_grad() || (present(bias) && bias->requires_grad()) ||
       (present(norm_weight) && norm_weight->requires_grad()) || (present(norm_bias) && norm_bias->requires_grad()));
  if (!tracked) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return fused_op().call(CUTLASSFUSE_OP_ARGUMENTS);
  }
  return forward_recorded<Forward>(CUTLASSFUSE_OP_ARGUMENTS);
}

}  // namespace

#if CUTLASSFUSE_WITH_CUDA
at::Tensor conv_transpose3d_relu_group_norm_autograd_cuda(CUTLASSFUSE_OP_PARAMETERS) {
  return autograd_kernel<&keeping_kernel<ForwardForBackward, &forward_for_backward_cuda>>(CUTLASSFUSE_OP_ARGUMENTS);
}
#endif

TORCH_LIBRARY_IMPL(cutlassfuse, Autograd, m) {
  m.impl("conv_transpose3d_relu_group_norm", &autograd_kernel<&redispatched_for_backward>);
}

}  // namespace cutlassfuse
