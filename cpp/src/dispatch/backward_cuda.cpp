// The CUDA kernels of the backward ops, ReLU + GroupNorm's and the block family's
// (norm_activation_backward): this project's kernels (norm/group_norm_backward.h) where
// they take the call, else ATen's.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <climits>
#include <vector>

#include "cutlassfuse/block.h"
#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/norm/group_norm_backward.h"
#include "cutlassfuse/op.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {
namespace {

// Float regions of the kernels' terms in one allocation, PReLU's slope terms last when
// `slopes`.
struct TermsLayout {
  int64_t sums, scale_dy, group_terms, affine_terms, bias_terms, slope_terms, floats;

  TermsLayout(const GroupNormBackwardShape& s, bool slopes) {
    const int64_t per_chunk = s.norm.batch * s.chunks * s.norm.channels;
    sums = 0;
    scale_dy = sums + 2 * per_chunk;
    group_terms = scale_dy + s.norm.batch * s.norm.channels;
    affine_terms = group_terms + 2 * s.norm.batch * s.norm.num_groups;
    bias_terms = affine_terms + 2 * s.norm.batch * s.norm.channels;
    slope_terms = bias_terms + per_chunk;
    floats = slope_terms + (slopes ? per_chunk : 0);
  }

  // The terms in `buffer`, of `floats` floats.
  GroupNormBackwardTerms terms(const at::Tensor& buffer) const {
    float* base = buffer.data_ptr<float>();
    return {reinterpret_cast<float2*>(base + sums),
            base + scale_dy,
            reinterpret_cast<float2*>(base + group_terms),
            reinterpret_cast<float2*>(base + affine_terms),
            base + bias_terms,
            floats > slope_terms ? base + slope_terms : nullptr};
  }
};

// The ReLU op's activation as its kernels read it: NDHWC, or the pixel-shuffle GEMM's
// space-to-depth order [N, D, H, W, sD, sH, sW, C] (op.h, KeptTensor), packed, with fewer
// than 2^31 pixels per sample.
bool kernels_take(const at::Tensor& activation, const std::optional<at::Tensor>& norm_weight) {
  const bool affine_ok = !present(norm_weight) || element_type(norm_weight->scalar_type()).has_value();
  if (!activation.is_cuda() || activation.numel() == 0 || !element_type(activation.scalar_type()) ||
      activation.size(0) > 65535 || !affine_ok)
    return false;
  if (activation.dim() != 8) return activation.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  return activation.is_contiguous() &&
         activation.numel() / (activation.size(0) * activation.size(7)) < (int64_t{1} << 31);
}

// Where the activation holds each sample's pixels.
PixelShuffle activation_order(const at::Tensor& activation) {
  PixelShuffle order;
  if (activation.dim() != 8) return order;
  for (int i = 0; i < 3; ++i) {
    order.block[i] = static_cast<int>(activation.size(4 + i));
    order.output_size[i] = static_cast<int>(activation.size(1 + i) * activation.size(4 + i));
  }
  return order;
}

}  // namespace

ReluGroupNormGradients relu_group_norm_backward_cuda(const at::Tensor& grad_output, const at::Tensor& activation,
                                                     const at::Tensor& mean, const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& norm_weight, int64_t num_groups) {
  if (!kernels_take(activation, norm_weight)) {
    return reference_relu_group_norm_backward(grad_output, activation, mean, rstd, norm_weight, num_groups);
  }
  const PixelShuffle order = activation_order(activation);
  if (!order.identity()) {
    const std::vector<int64_t> pixels{activation.size(0), activation.size(7), order.output_size[0],
                                      order.output_size[1], order.output_size[2]};
    TORCH_CHECK_VALUE(grad_output.sizes() == at::IntArrayRef(pixels), "cutlassfuse: grad_output of shape ",
                      grad_output.sizes(), " for an activation in space-to-depth order of pixel shape ", pixels);
  }
  const NvtxRange range("cutlassfuse.relu_group_norm_backward");
  const c10::cuda::CUDAGuard device_guard(activation.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int64_t n = activation.size(0), c = activation.size(activation.dim() == 8 ? 7 : 1);
  const GroupNormShape norm{n, c, n * c > 0 ? activation.numel() / (n * c) : 0, num_groups};
  const GroupNormBackwardShape shape =
      GroupNormBackwardShape::plan(norm, at::cuda::getCurrentDeviceProperties()->multiProcessorCount);
  const ElementType element = *element_type(activation.scalar_type());
  // dy in any layout (NCDHW, expanded, strided) as the kernels read it, channels-last.
  // A copy made here becomes dz: the grad kernel overwrites each element of dy it reads.
  const bool dy_packed = grad_output.is_contiguous(at::MemoryFormat::ChannelsLast3d);
  const at::Tensor dy = dy_packed ? grad_output : convert_memory_format_cuda(grad_output, /*channels_last=*/true);
  const at::Tensor dz =
      dy_packed ? at::empty(dy.sizes(), activation.options().memory_format(at::MemoryFormat::ChannelsLast3d)) : dy;
  const TermsLayout layout(shape, /*slopes=*/false);
  const at::Tensor buffer = at::empty({layout.floats}, activation.options().dtype(at::kFloat));
  const GroupNormBackwardTerms terms = layout.terms(buffer);
  std::optional<at::Tensor> gamma_kept;
  const void* gamma = data_or_null(norm_weight, gamma_kept);
  const ElementType affine = present(norm_weight) ? *element_type(norm_weight->scalar_type()) : ElementType::kFloat32;
  const at::Tensor mean32 = mean.to(at::kFloat).contiguous(), rstd32 = rstd.to(at::kFloat).contiguous();

  relu_group_norm_backward_sums(element, dy.data_ptr(), activation.data_ptr(), order, shape, terms, stream);
  group_norm_backward_coefficients(shape, mean32.data_ptr<float>(), rstd32.data_ptr<float>(), gamma, affine, terms,
                                   stream);
  relu_group_norm_backward_grad(element, dy.data_ptr(), activation.data_ptr(), order, shape, terms, dz.data_ptr(),
                                stream);

  // Separate tensors: the op's outputs must not alias one another.
  const at::Tensor dgamma = at::empty({c}, buffer.options()), dbeta = at::empty({c}, buffer.options()),
                   dbias = at::empty({c}, buffer.options());
  group_norm_backward_parameter_grads(
      shape, terms, {dgamma.data_ptr<float>(), dbeta.data_ptr<float>(), dbias.data_ptr<float>()}, stream);
  return {dz, dgamma, dbeta, dbias};
}

namespace {

// The family's kernels take CUDA tensors of float16, bfloat16 or float32 with gamma and
// beta of one of those dtypes (or absent), PReLU's slopes of one of those, at most
// 65535 samples and 2^31 - 1 planes (the grids' limits).
bool family_kernels_take(const NormActivationBackwardArgs& a) {
  const at::Tensor& y = a.conv_output;
  const bool slopes_ok = !present(a.activation.weight) || element_type(a.activation.weight->scalar_type()).has_value();
  return y.is_cuda() && y.numel() > 0 && element_type(y.scalar_type()).has_value() && y.size(0) <= 65535 &&
         y.size(0) * y.size(1) <= INT_MAX && affine_element_type(a.norm_weight, a.norm_bias).has_value() && slopes_ok;
}

// The operands the kernels read besides y and dy, kept alive for the call.
struct BackwardOperands {
  std::optional<at::Tensor> bias, gamma, beta, slopes;
  at::Tensor mean, rstd;
};

}  // namespace

NormActivationGradients norm_activation_backward_cuda(const NormActivationBackwardArgs& a) {
  const BlockProblem b = validate_norm_activation_backward(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (!family_kernels_take(a)) return reference_norm_activation_backward(a);
  const NvtxRange range("cutlassfuse.norm_activation_backward");
  const c10::cuda::CUDAGuard device_guard(a.conv_output.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  // The kernels read y, dy and write dz in y's suggested layout; dy in another (NCDHW
  // against channels-last, expanded, strided) is converted, and that copy becomes dz.
  const at::MemoryFormat format = a.conv_output.suggest_memory_format();
  const bool channels_last = format == at::MemoryFormat::ChannelsLast3d;
  const at::Tensor y = a.conv_output.contiguous(format);
  const bool dy_packed = a.grad_output.is_contiguous(format);
  const at::Tensor dy = dy_packed ? a.grad_output : convert_memory_format_cuda(a.grad_output, channels_last);
  const at::Tensor dz = dy_packed ? at::empty_like(y, format) : dy;

  const Problem& p = b.conv;
  const GroupNormShape norm{p.batch, p.out_channels, p.output_spatial(), p.num_groups};
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const GroupNormBackwardShape shape = channels_last ? GroupNormBackwardShape::plan(norm, sm_count)
                                                     : GroupNormBackwardShape::plan_planes(norm, sm_count);
  const bool prelu = b.activation == ActivationKind::kPReLU;
  const TermsLayout layout(shape, prelu);
  const at::TensorOptions floats = y.options().dtype(at::kFloat);
  const at::Tensor buffer = at::empty({layout.floats}, floats);
  const GroupNormBackwardTerms terms = layout.terms(buffer);

  BackwardOperands keep;
  keep.mean = a.mean.to(at::kFloat).contiguous();
  keep.rstd = a.rstd.to(at::kFloat).contiguous();
  const ElementType element = *element_type(y.scalar_type());
  const GroupNormAffine affine{data_or_null(a.norm_weight, keep.gamma), data_or_null(a.norm_bias, keep.beta),
                               *affine_element_type(a.norm_weight, a.norm_bias)};
  const NormActivationBackward op{
      channels_last ? ActivationLayout::kChannelsLast : ActivationLayout::kChannelsFirst,
      data_or_null(a.bias, keep.bias),
      keep.mean.data_ptr<float>(),
      keep.rstd.data_ptr<float>(),
      affine,
      kernel_activation(b.activation, a.activation.parameter, a.activation.weight, keep.slopes),
      a.activation_before_norm};

  norm_activation_backward_sums(element, dy.data_ptr(), y.data_ptr(), op, shape, terms, stream);
  group_norm_backward_coefficients(shape, op.mean, op.rstd, affine.gamma, affine.element, terms, stream);
  norm_activation_backward_grad(element, dy.data_ptr(), y.data_ptr(), op, shape, terms, dz.data_ptr(), stream);

  // Separate tensors: the op's outputs must not alias one another.
  const int64_t c = norm.channels;
  const at::Tensor dgamma = at::empty({c}, floats), dbeta = at::empty({c}, floats), dbias = at::empty({c}, floats);
  const at::Tensor channel_slopes = at::empty({prelu ? c : 0}, floats);
  group_norm_backward_parameter_grads(shape, terms,
                                      {dgamma.data_ptr<float>(), dbeta.data_ptr<float>(), dbias.data_ptr<float>(),
                                       prelu ? channel_slopes.data_ptr<float>() : nullptr},
                                      stream);
  // One slope for every channel: the channels' terms summed (ATen's reduction, a fixed order).
  const bool shared_slope = prelu && a.activation.weight->numel() == 1;
  return {dz, dgamma, dbeta, dbias, shared_slope ? channel_slopes.sum().view({1}) : channel_slopes};
}

}  // namespace cutlassfuse
