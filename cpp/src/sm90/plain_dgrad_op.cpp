// ConvTranspose3d alone through the fused family's kernel layers with CUTLASS's stock
// epilogue (dgrad_plain): the baseline the fused epilogue is measured against.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "cutlassfuse/plan/subpixel.h"
#include "cutlassfuse/settings.h"
#include "cutlassfuse/sm90/dgrad.h"
#include "dispatch/call_workspace.h"
#include "dispatch/op_arguments.h"
#include "sm90/left_operand.h"

namespace cutlassfuse {

at::Tensor cutlass_dgrad_plain(const OpArgs& a) {
  const Problem p = validate_and_describe(a);
  TORCH_CHECK_VALUE(a.input.is_cuda() && at::cuda::getDeviceProperties(a.input.device().index())->major == 9,
                    "cutlassfuse: the plain CUTLASS dgrad runs on sm_90 GPUs only");
  const auto element = element_type(a.input.scalar_type());
  TORCH_CHECK_TYPE(element && *element != ElementType::kFloat32,
                   "cutlassfuse: the plain CUTLASS dgrad takes float16 or bfloat16");
  const MathMode math = *tensor_core_math(*element, Float32Mode::kPyTorch);
  const BackendFlags flags = current_options().backend;
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const SubpixelPlan plan = plan_subpixel(p);
  TORCH_CHECK_VALUE(static_cast<int64_t>(plan.phases.size()) <= kMaxPartialsRegions,
                    "cutlassfuse: the plain CUTLASS dgrad takes at most 64 sub-pixel phases");
  CallWorkspace workspace;
  const sm90::LeftOperand left(a.input, math, p, /*pixel_major=*/false, workspace);
  const auto unit_counters_region = workspace.reserve(sm90::unit_counters_bytes());
  workspace.allocate(a.input.options());
  auto* unit_counters = workspace.at<sm90::UnitCounter>(unit_counters_region);
  const void* input = left.prepare(workspace, /*scales=*/nullptr, stream);
  const at::Tensor filter = sm90::right_operand(sm90::packed_filter(a), math, /*scales=*/nullptr, stream);
  const auto options = a.input.options().memory_format(at::MemoryFormat::ChannelsLast3d);
  const std::vector<int64_t> size{p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]};
  // Pixels no input reaches are zeros of the convolution (it has no bias here).
  at::Tensor out = plan.unreached_pixels > 0 ? at::zeros(size, options) : at::empty(size, options);
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  std::vector<sm90::PhaseLaunch> launches;
  for (const PhaseProblem& phase : plan.phases) {
    const sm90::DgradOperands operands{
        input, filter.data_ptr(), nullptr, out.data_ptr(), nullptr, nullptr, unit_counters + launches.size()};
    launches.push_back({&phase, operands});
  }
  const sm90::DgradConfig config = flags.dgrad_config.value_or(sm90::choose_config(p));
  const sm90::ScheduleOptions schedule{flags.skip_border_taps, flags.drawn_tile_schedule};
  with_math(math, [&](auto m) {
    if constexpr (is_16_bit(decltype(m)::value)) {
      sm90::dgrad_plain<decltype(m)::value>(config, p, launches, schedule, sm_count, stream);
    }
  });
  return out;
}

}  // namespace cutlassfuse
