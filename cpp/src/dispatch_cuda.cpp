// The CUDA kernel of the op: the fused sm90 path (per sub-pixel phase, a CUTLASS dgrad
// whose epilogue adds the bias, applies ReLU and reduces GroupNorm partial statistics;
// then finalize and normalize) when the call fits it, ATen's kernels otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/group_norm.h"
#include "cutlassfuse/layout.h"
#include "cutlassfuse/nvtx.h"
#include "cutlassfuse/op.h"
#include "cutlassfuse/subpixel.h"
#include "cutlassfuse/unreached_fill.h"
#include "op_arguments.h"

namespace cutlassfuse {
namespace {

// Calls f with the element type as a compile-time constant (fused path: 16-bit types).
template <class F>
decltype(auto) with_element(ElementType element, F&& f) {
  if (element == ElementType::kBFloat16) return f(std::integral_constant<ElementType, ElementType::kBFloat16>{});
  return f(std::integral_constant<ElementType, ElementType::kFloat16>{});
}

// The launches of one call: the sub-pixel phases, the kernel configuration, and where
// each phase's partials go (one region per phase, in phase order).
struct FusedPlan {
  SubpixelPlan subpixel;
  sm90::DgradConfig config;
  StatisticsSources sources;
  int64_t slots = 0;
};

FusedPlan make_fused_plan(const Problem& p) {
  FusedPlan plan{plan_subpixel(p), sm90::choose_config(p), {}, 0};
  TORCH_INTERNAL_ASSERT(plan.subpixel.phases.size() <= kMaxPartialsRegions);
  const sm90::TileExtent tile = sm90::tile_extent(plan.config);
  for (const PhaseProblem& phase : plan.subpixel.phases) {
    const GroupNormShape shape = sm90::phase_group_norm_shape(p, phase);
    const TilePartials tiles = TilePartials::for_tiles(shape, tile.m, tile.n);
    plan.sources.regions[plan.sources.region_count++] = {tiles, shape.spatial, plan.slots};
    plan.slots += tiles.slots(shape);
  }
  plan.sources.unreached_pixels = plan.subpixel.unreached_pixels;
  return plan;
}

// NDHWC view of the input: free when it already is; otherwise one pass of our
// transpose kernel (ATen's permuted copy is 5x slower on this pattern).
at::Tensor to_channels_last(const at::Tensor& input, ElementType element, const Problem& p, cudaStream_t stream) {
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return input;
  const NvtxRange range("cutlassfuse.ncdhw_to_ndhwc");
  const at::Tensor packed = input.contiguous();
  at::Tensor out = at::empty_like(packed, at::MemoryFormat::ChannelsLast3d);
  ncdhw_to_ndhwc(element, packed.data_ptr(), out.data_ptr(), p.batch, p.in_channels, p.input_spatial(), stream);
  return out;
}

// The filter [Cin, T, R, S, Cout]: the caller's pre-packed copy when given (the module
// caches one per weight version), else permuted here.
at::Tensor filter_of(const OpArgs& a) {
  if (present(a.packed_weight)) return a.packed_weight->contiguous();
  return a.weight.permute({0, 2, 3, 4, 1}).contiguous();
}

}  // namespace

std::string fused_path_unsupported_reason(const OpArgs& a, const Problem& p) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(a.input.device().index());
  if (props->major != 9 || props->minor != 0)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) + ", the fused kernels need sm_90";
  const auto element = element_type(a.input.scalar_type());
  if (!element || *element == ElementType::kFloat32) return "dtype is not float16 or bfloat16";
  if (!affine_element_type(a))
    return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  if (p.batch == 0) return "empty batch";
  if (const char* why = group_norm_unsupported_reason(group_norm_shape(p)); *why != '\0') return why;
  const SubpixelPlan plan = plan_subpixel(p);
  if (plan.phases.empty()) return "no input reaches the output (every pixel is ReLU(bias))";
  if (plan.phases.size() > kMaxPartialsRegions) return "more than 64 sub-pixel phases (stride product above 64)";
  const sm90::DgradConfig config = sm90::choose_config(p);
  for (const PhaseProblem& phase : plan.phases) {
    std::string why = with_element(*element, [&](auto e) {
      return sm90::dgrad_unsupported_reason<decltype(e)::value>(config, p, phase);
    });
    if (!why.empty()) return why;
  }
  return {};
}

std::string fused_path_description(const Problem& p) {
  const SubpixelPlan plan = plan_subpixel(p);
  std::string launches = plan.phases.size() == 1 ? std::string("CUTLASS sm90 dgrad ")
                                                 : std::to_string(plan.phases.size()) + " sub-pixel phases of CUTLASS sm90 dgrad ";
  if (plan.unreached_pixels > 0) launches = "ReLU(bias) fill of unreached pixels + " + launches;
  return launches + sm90::config_name(sm90::choose_config(p)) +
         " (epilogue: bias, ReLU, GroupNorm partial statistics) + normalize";
}

at::Tensor fused_forward_cuda(const OpArgs& a, const Problem& p) {
  const NvtxRange op_range("cutlassfuse.conv_transpose3d_relu_group_norm");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const ElementType element = *element_type(a.input.scalar_type());
  const auto options = a.input.options();

  const at::Tensor input = to_channels_last(a.input, element, p, stream);
  const at::Tensor filter = filter_of(a);
  std::optional<at::Tensor> bias, gamma, beta;
  at::Tensor activation = at::empty({p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]},
                                    options.memory_format(at::MemoryFormat::ChannelsLast3d));

  FusedPlan plan = make_fused_plan(p);
  plan.sources.bias = data_or_null(a.bias, bias);
  static_assert(sizeof(WelfordPartial) == 3 * sizeof(float));
  at::Tensor partials = at::empty({plan.slots, 3}, options.dtype(at::kFloat));
  auto* partials_ptr = reinterpret_cast<WelfordPartial*>(partials.data_ptr<float>());
  if (plan.subpixel.unreached_pixels > 0) {
    const NvtxRange range("cutlassfuse.fill_unreached_pixels");
    fill_unreached_pixels(element, activation.data_ptr(), plan.sources.bias, p, stream);
  }
  {
    const NvtxRange range("cutlassfuse.dgrad_bias_relu_stats");
    for (int i = 0; i < plan.sources.region_count; ++i) {
      const sm90::DgradOperands operands{input.data_ptr(), filter.data_ptr(), plan.sources.bias, activation.data_ptr(),
                                         partials_ptr + plan.sources.regions[i].first_slot};
      with_element(element, [&](auto e) {
        sm90::dgrad_fused<decltype(e)::value>(plan.config, p, plan.subpixel.phases[i], operands, sm_count, stream);
      });
    }
  }

  // Channels-last output is normalized in place: each element is read and written by
  // the same thread, after the statistics are complete.
  const bool channels_last = output_memory_format(a.input, a.weight) == at::MemoryFormat::ChannelsLast3d;
  at::Tensor out = channels_last ? activation : at::empty_like(activation, at::MemoryFormat::Contiguous);
  const GroupNormAffine affine{data_or_null(a.norm_weight, gamma), data_or_null(a.norm_bias, beta),
                               *affine_element_type(a)};
  const GroupNormShape shape = group_norm_shape(p);
  at::Tensor scale_shift = at::empty({group_norm_scale_shift_bytes(shape)}, options.dtype(at::kByte));
  const NvtxRange range("cutlassfuse.group_norm_finalize_apply");
  group_norm_finalize(element, partials_ptr, plan.sources, shape, affine, static_cast<float>(p.eps),
                      scale_shift.data_ptr(), stream);
  group_norm_apply(element, activation.data_ptr(), scale_shift.data_ptr(), shape, channels_last, out.data_ptr(),
                   stream);
  return out;
}

at::Tensor cutlass_dgrad_plain(const OpArgs& a, const Problem& p) {
  TORCH_CHECK_VALUE(a.input.is_cuda() && at::cuda::getDeviceProperties(a.input.device().index())->major == 9,
                    "cutlassfuse: the plain CUTLASS dgrad runs on sm_90 GPUs only");
  const auto element = element_type(a.input.scalar_type());
  TORCH_CHECK_TYPE(element && *element != ElementType::kFloat32, "cutlassfuse: the plain CUTLASS dgrad takes float16 or bfloat16");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const at::Tensor input = to_channels_last(a.input, *element, p, stream);
  const at::Tensor filter = filter_of(a);
  const SubpixelPlan plan = plan_subpixel(p);
  const auto options = a.input.options().memory_format(at::MemoryFormat::ChannelsLast3d);
  const std::vector<int64_t> size{p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]};
  // Pixels no input reaches are zeros of the convolution (it has no bias here).
  at::Tensor out = plan.unreached_pixels > 0 ? at::zeros(size, options) : at::empty(size, options);
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  for (const PhaseProblem& phase : plan.phases) {
    with_element(*element, [&](auto e) {
      sm90::dgrad_plain<decltype(e)::value>(p, phase, input.data_ptr(), filter.data_ptr(), out.data_ptr(), sm_count,
                                            stream);
    });
  }
  return out;
}

}  // namespace cutlassfuse
