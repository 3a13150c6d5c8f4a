// The CUDA kernel of the ReLU + GroupNorm backward op: this project's kernels
// (norm/group_norm_backward.h) where they take the call, else ATen's.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/norm/group_norm_backward.h"
#include "cutlassfuse/op.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {
namespace {

// Float regions of the kernels' terms in one allocation.
struct TermsLayout {
  int64_t sums, scale_dy, group_terms, affine_terms, bias_terms, floats;

  explicit TermsLayout(const GroupNormBackwardShape& s) {
    const int64_t per_chunk = s.norm.batch * s.chunks * s.norm.channels;
    sums = 0;
    scale_dy = sums + 2 * per_chunk;
    group_terms = scale_dy + s.norm.batch * s.norm.channels;
    affine_terms = group_terms + 2 * s.norm.batch * s.norm.num_groups;
    bias_terms = affine_terms + 2 * s.norm.batch * s.norm.channels;
    floats = bias_terms + per_chunk;
  }
};

bool kernels_take(const at::Tensor& activation, const std::optional<at::Tensor>& norm_weight) {
  const bool affine_ok = !present(norm_weight) || element_type(norm_weight->scalar_type()).has_value();
  return activation.is_cuda() && activation.numel() > 0 && element_type(activation.scalar_type()).has_value() &&
         activation.is_contiguous(at::MemoryFormat::ChannelsLast3d) && activation.size(0) <= 65535 && affine_ok;
}

}  // namespace

ReluGroupNormGradients relu_group_norm_backward_cuda(const at::Tensor& grad_output, const at::Tensor& activation,
                                                     const at::Tensor& mean, const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& norm_weight, int64_t num_groups) {
  if (!kernels_take(activation, norm_weight)) {
    return reference_relu_group_norm_backward(grad_output, activation, mean, rstd, norm_weight, num_groups);
  }
  const NvtxRange range("cutlassfuse.relu_group_norm_backward");
  const c10::cuda::CUDAGuard device_guard(activation.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = activation.size(0), c = activation.size(1);
  const GroupNormShape norm{n, c, n * c > 0 ? activation.numel() / (n * c) : 0, num_groups};
  const GroupNormBackwardShape shape =
      GroupNormBackwardShape::plan(norm, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  const ElementType element = *element_type(activation.scalar_type());
  // dy in any layout (NCDHW, expanded, strided) as the kernels read it, channels-last.
  // A copy made here becomes dz: the grad kernel overwrites each element of dy it reads.
  const bool dy_packed = grad_output.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  const at::Tensor dy = dy_packed ? grad_output : convert_memory_format_cuda(grad_output, /*channels_last=*/true);
  const at::Tensor dz = dy_packed ? at::empty_like(activation, at::MemoryFormat::ChannelsLast3d) : dy;
  const TermsLayout layout(shape);
  const at::Tensor buffer = at::empty({layout.floats}, activation.options().dtype(at::kFloat));
  float* base = buffer.data_ptr<float>();
  const GroupNormBackwardTerms terms{reinterpret_cast<float2*>(base + layout.sums), base + layout.scale_dy,
                                     reinterpret_cast<float2*>(base + layout.group_terms),
                                     reinterpret_cast<float2*>(base + layout.affine_terms), base + layout.bias_terms};
  std::optional<at::Tensor> gamma_kept;
  const void* gamma = data_or_null(norm_weight, gamma_kept);
  const ElementType affine = present(norm_weight) ? *element_type(norm_weight->scalar_type()) : ElementType::kFloat32;
  const at::Tensor mean32 = mean.to(at::kFloat).contiguous(), rstd32 = rstd.to(at::kFloat).contiguous();

  relu_group_norm_backward_sums(element, dy.data_ptr(), activation.data_ptr(), shape, terms, stream);
  relu_group_norm_backward_coefficients(shape, mean32.data_ptr<float>(), rstd32.data_ptr<float>(), gamma, affine, terms,
                                        stream);
  relu_group_norm_backward_grad(element, dy.data_ptr(), activation.data_ptr(), shape, terms, dz.data_ptr(), stream);

  // Separate tensors: the op's outputs must not alias one another.
  const at::Tensor dgamma = at::empty({c}, buffer.options()), dbeta = at::empty({c}, buffer.options()),
                   dbias = at::empty({c}, buffer.options());
  relu_group_norm_backward_parameter_grads(
      shape, terms, {dgamma.data_ptr<float>(), dbeta.data_ptr<float>(), dbias.data_ptr<float>()}, stream);
  return {dz, dgamma, dbeta, dbias};
}

}  // namespace cutlassfuse
