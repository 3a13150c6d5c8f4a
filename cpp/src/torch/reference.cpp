// The reference implementation: ATen's ConvTranspose3d, ReLU and GroupNorm kernels.
// The CPU kernel of the op, and its CUDA kernel for calls no kernel path takes.
#include <ATen/ATen.h>

#include "cutlassfuse/op.h"

namespace cutlassfuse {

at::Tensor reference_forward(const OpArgs& a) {
  at::Tensor y =
      at::conv_transpose3d(a.input, a.weight, a.bias, a.stride, a.padding, a.output_padding, a.groups, a.dilation);
  y.relu_();
  // ATen's CUDA GroupNorm reads gamma and beta as the input's type; the op takes them in
  // any floating type (float32 ones with a float16 input under autocast).
  const auto as_input_type = [&](const std::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() ? std::optional<at::Tensor>(t->to(y.scalar_type())) : t;
  };
  y = at::group_norm(y, a.num_groups, as_input_type(a.norm_weight), as_input_type(a.norm_bias), a.eps);
  // ATen's kernels already follow this rule; stating it keeps the op's contract
  // (and its fake kernel) independent of backend details.
  return y.contiguous(output_memory_format(a.input, a.weight));
}

}  // namespace cutlassfuse
