#include "norm/block_norm.h"

#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/common/nvtx.h"
#include "dispatch/device_allocation.h"
#include "dispatch/op_arguments.h"

namespace cutlassfuse {

StatisticsWorkspace::StatisticsWorkspace(const TilePartials& tiles, const GroupNormShape& shape,
                                         const at::TensorOptions& options) {
  // The scale and shift start at a 256-byte boundary, as an allocation of their own would.
  constexpr int64_t kAlignment = 256;
  const int64_t partial_bytes = ceil_div(tiles.slots(shape) * int64_t{sizeof(WelfordPartial)}, kAlignment) * kAlignment;
  bytes = empty_on_device({partial_bytes + group_norm_scale_shift_bytes(shape)}, options.dtype(at::kByte));
  scale_shift = static_cast<char*>(bytes.data_ptr()) + partial_bytes;
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
  const GroupNormAffine affine{data_or_null(norm.gamma, operands.gamma), data_or_null(norm.beta, operands.beta),
                               *affine_element_type(norm.gamma, norm.beta)};
  SingleRegionFinalize finalize = statistics_finalize(stats.data(), stats.sources, element, shape, affine,
                                                      static_cast<float>(p.eps), stats.scale_shift);
  finalize.mean_shift = stats.mean_shift;
  NormResult result;
  result.out = out.has_value() ? *out : y;
  if (keep) {
    result.mean = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
    result.rstd = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
    finalize.mean = result.mean.data_ptr<float>();
    finalize.rstd = result.rstd.data_ptr<float>();
  }
  group_norm_finalize(finalize, stream);
  NormalizeOutputs outputs;
  if (norm.residual.has_value()) outputs.residual = norm.residual->const_data_ptr();
  if (out.has_value()) {
    outputs.out = out->data_ptr();
    outputs.out_channels_first = out->is_contiguous();
  }
  norm_activation_normalize(element, const_cast<void*>(y.const_data_ptr()), layout, norm.pre, stats.scale_shift,
                            norm.after, shape, outputs, stream);
  return result;
}

}  // namespace cutlassfuse
