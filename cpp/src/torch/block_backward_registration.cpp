// norm_activation_backward (block.h): the gradients of GroupNorm and the activation
// around it, from the output gradient and what the block family's forwards keep. Its
// schema, its reference (ATen's kernels: the CPU kernel, and the CUDA kernel's for calls
// this project's kernels do not take) and its kernels per backend; its fake kernel is in
// python/cutlassfuse/blocks.py.
//
// The reference recomputes what it reads: z = y + bias, the norm's input x = act(z)
// (activation before the norm) or z, and for an activation after the norm its input,
// the normalized x. Then the activation's backward, GroupNorm's backward (ATen's
// kernel) and the bias gradient.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "cutlassfuse/block.h"
#include "cutlassfuse/op.h"
#include "torch/aten_norm.h"
#include "torch/block_redispatch.h"

namespace cutlassfuse {
namespace {

// GroupNorm of x from its saved statistics, with gamma and beta: the activation's input
// when it follows the norm.
at::Tensor normalized(const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
                      const std::optional<at::Tensor>& gamma, const std::optional<at::Tensor>& beta) {
  const int64_t n = x.size(0), groups = mean.size(1);
  at::Tensor v = ((x.contiguous().view({n, groups, -1}) - mean.unsqueeze(2)) * rstd.unsqueeze(2)).view(x.sizes());
  if (present(gamma)) v = v * per_channel(*gamma, v);
  if (present(beta)) v = v + per_channel(*beta, v);
  return v.to(x.scalar_type());
}

NormActivationGradients checked_reference(const NormActivationBackwardArgs& a) {
  validate_norm_activation_backward(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return reference_norm_activation_backward(a);
}

// Unpacks the schema's arguments for `Impl`: one signature for every kernel.
template <NormActivationGradients (*Impl)(const NormActivationBackwardArgs&)>
NormActivationGradients backward_kernel(CUTLASSFUSE_NORM_BACKWARD_PARAMETERS) {
  return Impl({grad_output,
               conv_output,
               bias,
               mean,
               rstd,
               norm_weight,
               norm_bias,
               num_groups,
               {activation, activation_parameter, activation_weight},
               activation_before_norm});
}

}  // namespace

NormActivationGradients reference_norm_activation_backward(const NormActivationBackwardArgs& a) {
  const at::Tensor& y = a.conv_output;
  const at::ScalarType type = y.scalar_type();
  const ActivationKind kind = *activation_from_name(a.activation.name);
  const double parameter = a.activation.parameter;
  const bool before = a.activation_before_norm;
  const at::Tensor z = present(a.bias) ? y + per_channel(*a.bias, y) : y;
  const at::Tensor x = before ? apply_activation(z, kind, parameter, a.activation.weight) : z;
  at::Tensor dn = a.grad_output, dslopes;
  if (!before) {
    std::tie(dn, dslopes) = activation_backward(
        a.grad_output, normalized(x, a.mean, a.rstd, a.norm_weight, a.norm_bias), kind, parameter, a.activation.weight);
  }
  const auto [n, c, pixels] = group_norm_extents(x);
  const at::MemoryFormat format = group_norm_input_format(x);
  // Without gamma GroupNorm's input gradient is that of gamma = 1.
  const at::Tensor gamma = present(a.norm_weight) ? a.norm_weight->to(type) : at::ones({c}, x.options());
  auto [dz, dgamma, dbeta] =
      at::native_group_norm_backward(dn.contiguous(format), x.contiguous(format), a.mean.to(type), a.rstd.to(type),
                                     gamma, n, c, pixels, a.num_groups, {true, true, true});
  if (before) std::tie(dz, dslopes) = activation_backward(dz, z, kind, parameter, a.activation.weight);
  const at::ScalarType statistics = statistics_type(type);
  dz = dz.contiguous(y.suggest_memory_format());
  const at::Tensor dbias = dz.sum({0, 2, 3, 4}, /*keepdim=*/false, statistics);
  return {dz, dgamma.to(statistics), dbeta.to(statistics), dbias,
          dslopes.defined() ? dslopes : at::empty({0}, y.options().dtype(statistics))};
}

TORCH_LIBRARY_FRAGMENT(cutlassfuse, m) {
  // From the output gradient and what the forward kept: the gradients of the
  // convolution's output, gamma, beta, the convolution's bias and PReLU's weight (block.h).
  m.def(
      "norm_activation_backward(Tensor grad_output, Tensor conv_output, Tensor? bias, Tensor mean, Tensor rstd, "
      "Tensor? norm_weight, Tensor? norm_bias, int num_groups, str activation, float activation_parameter, "
      "Tensor? activation_weight, bool activation_before_norm) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cutlassfuse, CPU, m) { m.impl("norm_activation_backward", &backward_kernel<&checked_reference>); }

// A library built without the CUDA toolkit serves CUDA tensors through ATen.
TORCH_LIBRARY_IMPL(cutlassfuse, CUDA, m) {
#if CUTLASSFUSE_WITH_CUDA
  m.impl("norm_activation_backward", &backward_kernel<&norm_activation_backward_cuda>);
#else
  m.impl("norm_activation_backward", &backward_kernel<&checked_reference>);
#endif
}

}  // namespace cutlassfuse
