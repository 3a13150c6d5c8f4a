#include "norm/block_norm.h"

#include <ATen/cuda/CUDAContext.h>

#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/settings.h"
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

namespace {

GroupNormAffine norm_affine(const NormEpilogue& norm, KernelOperands& operands) {
  return {data_or_null(norm.gamma, operands.gamma), data_or_null(norm.beta, operands.beta),
          *affine_element_type(norm.gamma, norm.beta)};
}

// The call on `y` (of `type`, packed in `layout`), in place, with `residual` added.
ResidentNormCall resident_call(at::ScalarType type, ActivationLayout layout, const void* y, const void* residual,
                               const NormEpilogue& norm, const GroupNormAffine& affine, const Problem& p) {
  return {*element_type(type),
          y,
          layout,
          norm.pre,
          norm.after,
          group_norm_shape(p),
          affine,
          static_cast<float>(p.eps),
          const_cast<void*>(y),
          residual,
          nullptr};
}

// The result's tensors: `out` (y where absent), mean and rstd when `keep`.
NormResult norm_result(const at::Tensor& y, const std::optional<at::Tensor>& out, const Problem& p, bool keep) {
  NormResult result;
  result.out = out.has_value() ? *out : y;
  if (keep) {
    result.mean = empty_on_device({p.batch, p.num_groups}, y.options().dtype(at::kFloat));
    result.rstd = empty_on_device({p.batch, p.num_groups}, y.options().dtype(at::kFloat));
  }
  return result;
}

}  // namespace

ActivationLayout layout_of(const at::Tensor& y) {
  return y.is_contiguous() ? ActivationLayout::kChannelsFirst : ActivationLayout::kChannelsLast;
}

std::optional<NormResult> resident_norm(const at::Tensor& y, const std::optional<at::Tensor>& out,
                                        const NormEpilogue& norm, const Problem& p, bool keep,
                                        KernelOperands& operands) {
  if (!current_options().backend.resident_norm) return std::nullopt;
  if (out.has_value() && out->is_contiguous() != y.is_contiguous()) return std::nullopt;
  ResidentNormCall call = resident_call(y.scalar_type(), layout_of(y), y.const_data_ptr(),
                                        norm.residual.has_value() ? norm.residual->const_data_ptr() : nullptr, norm,
                                        norm_affine(norm, operands), p);
  if (out.has_value()) call.out = out->data_ptr();
  const std::optional<ResidentNormPlan> plan = plan_resident_norm(call);
  if (!plan.has_value()) return std::nullopt;
  const at::Tensor workspace = empty_on_device({plan->workspace_bytes()}, y.options().dtype(at::kByte));
  call.workspace = workspace.data_ptr();
  NormResult result = norm_result(y, out, p, keep);
  if (keep) {
    call.mean = result.mean.data_ptr<float>();
    call.rstd = result.rstd.data_ptr<float>();
  }
  if (!norm_activation_resident(call, *plan, at::cuda::getCurrentCUDAStream())) return std::nullopt;
  return result;
}

bool resident_norm_takes(at::ScalarType type, at::MemoryFormat format, const void* data, const void* residual,
                         const Problem& p) {
  if (!current_options().backend.resident_norm) return false;
  KernelOperands operands;
  const std::optional<at::Tensor> none;
  const NormEpilogue norm{none, none, {}, {}};
  const ActivationLayout layout =
      format == at::MemoryFormat::ChannelsLast3d ? ActivationLayout::kChannelsLast : ActivationLayout::kChannelsFirst;
  return plan_resident_norm(resident_call(type, layout, data, residual, norm, norm_affine(norm, operands), p))
      .has_value();
}

NormResult finish_norm(const at::Tensor& y, const std::optional<at::Tensor>& out, const StatisticsWorkspace& stats,
                       const NormEpilogue& norm, const Problem& p, bool keep, KernelOperands& operands) {
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const ElementType element = *element_type(y.scalar_type());
  const ActivationLayout layout = layout_of(y);
  const GroupNormShape shape = group_norm_shape(p);
  SingleRegionFinalize finalize =
      statistics_finalize(stats.data(), stats.sources, element, shape, norm_affine(norm, operands),
                          static_cast<float>(p.eps), stats.scale_shift);
  finalize.mean_shift = stats.mean_shift;
  NormResult result = norm_result(y, out, p, keep);
  if (keep) {
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
