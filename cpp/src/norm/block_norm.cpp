#include "norm/block_norm.h"

#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/common/nvtx.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {

StatisticsWorkspace::StatisticsWorkspace(const TilePartials& tiles, const GroupNormShape& shape,
                                         const at::TensorOptions& options) {
  static_assert(sizeof(WelfordPartial) == 3 * sizeof(float));
  partials = at::empty({tiles.slots(shape), 3}, options.dtype(at::kFloat));
  sources.regions[0] = {tiles, shape.spatial, 0};
  sources.region_count = 1;
}

NormResult finish_norm(const at::Tensor& y, const std::optional<at::Tensor>& out, const StatisticsWorkspace& stats,
                       const NormEpilogue& norm, const Problem& p, bool keep, KernelOperands& operands) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const ElementType element = *element_type(y.scalar_type());
  const ActivationLayout layout =
      y.is_contiguous() ? ActivationLayout::kChannelsFirst : ActivationLayout::kChannelsLast;
  const GroupNormShape shape = group_norm_shape(p);
  const auto options = y.options();
  const at::Tensor scale_shift = at::empty({group_norm_scale_shift_bytes(shape)}, options.dtype(at::kByte));
  const GroupNormAffine affine{data_or_null(norm.gamma, operands.gamma), data_or_null(norm.beta, operands.beta),
                               *affine_element_type(norm.gamma, norm.beta)};
  StatisticsFinalize finalize = statistics_finalize(stats.data(), stats.sources, element, shape, affine,
                                                    static_cast<float>(p.eps), scale_shift.data_ptr());
  finalize.mean_shift = stats.mean_shift;
  NormResult result;
  result.out = out.has_value() ? *out : y;
  if (keep) {
    result.mean = at::empty({p.batch, p.num_groups}, options.dtype(at::kFloat));
    result.rstd = at::empty({p.batch, p.num_groups}, options.dtype(at::kFloat));
    finalize.mean = result.mean.data_ptr<float>();
    finalize.rstd = result.rstd.data_ptr<float>();
  }
  group_norm_finalize(finalize, stream);
  NormalizeOutputs outputs;
  if (out.has_value()) {
    outputs.out = out->data_ptr();
    outputs.out_channels_first = out->is_contiguous();
  }
  norm_activation_normalize(element, const_cast<void*>(y.const_data_ptr()), layout, norm.pre, scale_shift.data_ptr(),
                            norm.after, shape, outputs, stream);
  return result;
}

}  // namespace cutlassfuse
