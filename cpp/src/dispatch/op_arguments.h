// The op's tensor arguments as the CUDA paths read them: element types, optional
// tensors, GroupNorm sizes. Shared by the kernel paths.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/op.h"
#include "cutlassfuse/plan/activation.h"
#include "torch/redispatch.h"

namespace cutlassfuse {

inline std::optional<ElementType> element_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return ElementType::kFloat16;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kFloat: return ElementType::kFloat32;
    default: return std::nullopt;
  }
}

// gamma and beta are read by one kernel argument type: both absent, or sharing one of
// the kernels' dtypes.
inline std::optional<ElementType> affine_element_type(const std::optional<at::Tensor>& gamma,
                                                      const std::optional<at::Tensor>& beta) {
  const at::Tensor* any = present(gamma) ? &*gamma : present(beta) ? &*beta : nullptr;
  if (any == nullptr) return ElementType::kFloat32;
  for (const auto* t : {&gamma, &beta}) {
    if (present(*t) && (*t)->scalar_type() != any->scalar_type()) return std::nullopt;
  }
  return element_type(any->scalar_type());
}

inline std::optional<ElementType> affine_element_type(const OpArgs& a) {
  return affine_element_type(a.norm_weight, a.norm_bias);
}

// The tensor's data, through a contiguous copy kept alive by `keep_alive` if needed.
inline const void* data_or_null(const std::optional<at::Tensor>& t, std::optional<at::Tensor>& keep_alive) {
  if (!present(t)) return nullptr;
  keep_alive = t->contiguous();
  return keep_alive->data_ptr();
}

// An activation as the kernels read it; PReLU's slopes through a contiguous copy kept
// alive by `keep_alive` if needed (element_type() of their dtype must exist).
inline ActivationParams kernel_activation(ActivationKind kind, double parameter,
                                          const std::optional<at::Tensor>& slopes,
                                          std::optional<at::Tensor>& keep_alive) {
  ActivationParams params;
  params.kind = kind;
  params.parameter = static_cast<float>(parameter);
  if (kind == ActivationKind::kPReLU) {
    params.slopes = data_or_null(slopes, keep_alive);
    params.slopes_element = *element_type(slopes->scalar_type());
    params.slope_count = slopes->numel();
  }
  return params;
}

inline GroupNormShape group_norm_shape(const Problem& p) {
  return {p.batch, p.out_channels, p.output_spatial(), p.num_groups};
}

}  // namespace cutlassfuse
