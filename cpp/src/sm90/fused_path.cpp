#include "sm90/fused_path.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <span>
#include <vector>

#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/common/unreached_fill.h"
#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/plan/math_mode.h"
#include "cutlassfuse/plan/subpixel.h"
#include "cutlassfuse/sm90/dgrad.h"
#include "cutlassfuse/sm90/group_norm_finish.h"
#include "dispatch/call_workspace.h"
#include "dispatch/device_allocation.h"
#include "dispatch/op_arguments.h"
#include "dispatch/phase_streams.h"
#include "sm90/left_operand.h"
#include "sm90/tma_alignment.h"

namespace cutlassfuse::sm90 {
namespace {

// The launches of one call. `conv` is what the CUTLASS launches compute: the call's
// own problem as sub-pixel phases, or, when kernel == stride, its pixel-shuffle GEMM
// (one launch writing the activation in space-to-depth order), which reads an NCDHW
// 16-bit input as it is when it can (pixel_major). Each launch's partials get a
// region, one per block of channels for the GEMM, in a fixed order.
struct Launches {
  MathMode math = MathMode::kFloat16;
  Problem conv;
  bool pixel_major = false;
  SubpixelPlan subpixel;
  PixelShuffle order;
  DgradConfig config = DgradConfig::k128x128_pingpong;
  ScheduleOptions schedule;
  int64_t phase_streams = 1;
  StatisticsSources sources;
  int64_t slots = 0;

  int64_t blocks() const { return int64_t{order.block[0]} * order.block[1] * order.block[2]; }
  int64_t regions() const { return static_cast<int64_t>(subpixel.phases.size()) * blocks(); }
};

// The pixel-major GEMM takes NCDHW (contiguous) 16-bit inputs of a pixel-shuffle GEMM
// whose rows TMA can address (pixels per sample a multiple of 8).
bool reads_pixel_major(const at::Tensor& input, MathMode math, const Problem& gemm) {
  if (!input.is_contiguous()) return false;
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return false;  // also NCDHW-contiguous when C or DHW is 1
  return with_math(math, [&](auto m) {
    if constexpr (is_16_bit(decltype(m)::value)) {
      return pixel_major_gemm_unsupported_reason<decltype(m)::value>(gemm).empty();
    } else {
      return false;
    }
  });
}

Launches describe_launches(const Call& call, MathMode math) {
  const Problem& p = call.problem;
  const BackendFlags& flags = call.options.backend;
  Launches l;
  l.math = math;
  const bool shuffle_gemm = is_pixel_shuffle_gemm(p);
  l.conv = shuffle_gemm ? pixel_shuffle_gemm_problem(p) : p;
  l.conv.in_channels = gemm_in_channels(math, l.conv.in_channels);
  l.subpixel = plan_subpixel(l.conv);
  // The pixel-major GEMM is the 128x128 ping-pong configuration (clusters of one) for
  // NCDHW input: a pinned configuration other than that runs as pinned.
  l.pixel_major = shuffle_gemm && (!flags.dgrad_config || *flags.dgrad_config == DgradConfig::k128x128_pingpong) &&
                  reads_pixel_major(call.args.input, math, l.conv);
  l.config = l.pixel_major ? DgradConfig::k128x128_pingpong : flags.dgrad_config.value_or(choose_config(l.conv));
  l.schedule = {flags.skip_border_taps, flags.drawn_tile_schedule};
  l.phase_streams = flags.phase_streams;
  if (l.conv.out_channels != p.out_channels) {
    for (int i = 0; i < 3; ++i) {
      l.order.block[i] = static_cast<int>(p.stride[i]);
      l.order.output_size[i] = static_cast<int>(p.output_size[i]);
    }
  }
  return l;
}

// Gives every launch's partials their region of the workspace, in launch order.
void place_partials(Launches& l, const Problem& p) {
  TORCH_INTERNAL_ASSERT(l.regions() <= kMaxPartialsRegions);
  const TileExtent tile = l.pixel_major ? kPixelMajorGemmTile : tile_extent(l.config);
  for (const PhaseProblem& phase : l.subpixel.phases) {
    GroupNormShape shape = phase_group_norm_shape(l.conv, phase);
    if (l.pixel_major) shape.spatial = pixel_major_statistics_rows(shape.spatial);
    const TilePartials tiles = TilePartials::for_tiles(shape, tile.m, tile.n);
    for (int64_t block = 0; block < l.blocks(); ++block) {
      l.sources.regions[l.sources.region_count++] = {tiles, shape.spatial, l.slots,
                                                     static_cast<int>(block * p.num_groups)};
    }
    l.slots += tiles.slots(shape);
  }
  l.sources.unreached_pixels = l.subpixel.unreached_pixels;
}

// Why the kernels cannot run the call, or empty.
std::string unsupported_reason(const Call& call, const Launches& l) {
  if (l.subpixel.phases.empty()) return "no input reaches the output (every pixel is ReLU(bias))";
  if (l.regions() > kMaxPartialsRegions) return "more than 64 sub-pixel phases (stride product above 64)";
  if (l.pixel_major) return {};
  for (const PhaseProblem& phase : l.subpixel.phases) {
    std::string why = with_math(
        l.math, [&](auto m) { return dgrad_unsupported_reason<decltype(m)::value>(l.config, l.conv, phase); });
    if (!why.empty()) return why;
  }
  return {};
}

class FusedCall final : public PlannedCall {
 public:
  FusedCall(const Call& call, Launches launches) : call_(call), l_(std::move(launches)) {}

  std::string description() const override;
  ForwardOutputs run() const override;

 private:
  std::string launches_description() const;
  std::string kept_description() const;
  std::string schedule_description() const;
  bool keeps_space_to_depth() const {
    return call_.keep_for_backward && call_.kept == KeptTensor::kActivationSpaceToDepth;
  }
  void launch_phases(const DgradOperands& operands, int sm_count) const;
  void launch_deconvolution(const DgradOperands& operands, int sm_count, cudaStream_t stream) const;

  Call call_;
  Launches l_;
};

std::string FusedCall::description() const { return launches_description() + kept_description(); }

// What a call keeping its tensors for the backward keeps, and which launch writes them.
std::string FusedCall::kept_description() const {
  if (!call_.keep_for_backward) return "";
  const char* activation = l_.order.identity() ? "the activation (channels-last, stored by the epilogue)"
                           : keeps_space_to_depth()
                               ? "the activation in the pixel-shuffle GEMM's space-to-depth order, as its epilogue "
                                 "stores it (the backward reorders it)"
                               : "the activation (channels-last, copied to pixel order by the normalize)";
  return std::string("; keeping for the backward: ") + activation +
         " and GroupNorm's mean and rstd (written by the finalize)";
}

std::string FusedCall::launches_description() const {
  if (l_.pixel_major) {
    return "pixel-shuffle GEMM (kernel == stride; one launch for " + std::to_string(l_.blocks()) +
           " output blocks) reading the NCDHW input as it is: CUTLASS sm90 GEMM, M-major input, batched over "
           "samples, 128x128_pingpong (epilogue: bias, ReLU, GroupNorm partial statistics) + normalize";
  }
  std::string launches = "CUTLASS sm90 dgrad ";
  if (l_.blocks() > 1) {
    launches = "pixel-shuffle GEMM (kernel == stride; one launch for " + std::to_string(l_.blocks()) +
               " output blocks) of CUTLASS sm90 dgrad ";
  } else if (l_.subpixel.phases.size() > 1) {
    launches = std::to_string(l_.subpixel.phases.size()) + " sub-pixel phases of CUTLASS sm90 dgrad ";
  }
  if (l_.subpixel.unreached_pixels > 0) launches = "ReLU(bias) fill of unreached pixels + " + launches;
  if (l_.math == MathMode::kFloat32AsBf16x3) {
    launches = "float32 as three bfloat16 piece products (float32 mode 'bf16x3'): " + launches;
  } else if (l_.math == MathMode::kFloat32AsTf32) {
    launches =
        "float32 at TF32's precision (float32 mode 'tf32'): operands scaled by powers of two, rounded to nearest "
        "float16 (TF32's 11-bit significands) on float16 tensor cores, descaled in the epilogue: " +
        launches;
  }
  return launches + config_name(l_.config) + " (epilogue: bias, ReLU, GroupNorm partial statistics) + normalize" +
         schedule_description();
}

// The ping-pong kernel's scheduling decisions (tap_window.h, unit_schedule.cuh) and
// the phase streams, as the launches will make them.
std::string FusedCall::schedule_description() const {
  const std::vector<PhaseProblem>& phases = l_.subpixel.phases;
  const size_t streams = std::min(static_cast<size_t>(l_.phase_streams), phases.size());
  std::vector<bool> skips;
  for (const PhaseProblem& phase : phases) skips.push_back(phase_skips_border_taps(l_.conv, phase, l_.schedule));
  // A launch draws its units (unit_schedule()) with clusters of one, where its units
  // are uneven (some phase skips taps) and more than two per CTA (one per SM).
  const int sm_count = at::cuda::getDeviceProperties(call_.args.input.device().index())->multiProcessorCount;
  const TileExtent tile = tile_extent(l_.config);
  const size_t per_launch = streams > 1 ? 1 : kMaxPhasesPerLaunch;
  size_t drawing = 0, launches = 0;
  for (size_t first = 0; first < phases.size(); first += per_launch, ++launches) {
    const size_t last = std::min(phases.size(), first + per_launch);
    int64_t units = 0;
    bool uneven = false;
    for (size_t i = first; i < last; ++i) {
      units += ceil_div(l_.conv.batch * phases[i].output_spatial(), tile.m) * ceil_div(l_.conv.out_channels, tile.n);
      uneven = uneven || skips[i];
    }
    drawing += l_.schedule.drawn_tile_schedule && cluster_size(l_.config) == 1 && uneven && units > 2 * sm_count;
  }
  const auto skipping = std::count(skips.begin(), skips.end(), true);
  std::string text = "; border taps skipped in " + std::to_string(skipping) + " of " + std::to_string(phases.size()) +
                     " phases; " + (drawing > 0 ? "tiles drawn from a counter" : "tiles walked statically");
  if (drawing > 0 && drawing < launches) {
    text += " in " + std::to_string(drawing) + " of " + std::to_string(launches) + " launches";
  }
  if (streams > 1) text += "; phases on " + std::to_string(streams) + " streams";
  return text;
}

// The CUTLASS dgrad launches of every sub-pixel phase (one phase for stride 1 and for
// the pixel-shuffle GEMM), each phase reading and writing its views of `operands`.
void FusedCall::launch_phases(const DgradOperands& operands, int sm_count) const {
  std::vector<PhaseLaunch> launches;
  for (size_t i = 0; i < l_.subpixel.phases.size(); ++i) {
    DgradOperands phase_operands = operands;
    phase_operands.partials += l_.sources.regions[i * l_.blocks()].first_slot;
    phase_operands.unit_counter += i;
    launches.push_back({&l_.subpixel.phases[i], phase_operands});
  }
  PhaseStreams streams(l_.phase_streams, launches.size(), at::cuda::getCurrentCUDAStream());
  with_math(l_.math, [&](auto m) {
    constexpr MathMode M = decltype(m)::value;
    if (streams.count() <= 1) {
      dgrad_fused<M>(l_.config, l_.conv, launches, l_.schedule, sm_count, streams.stream_for(0));
      return;
    }
    for (size_t i = 0; i < launches.size(); ++i) {
      dgrad_fused<M>(l_.config, l_.conv, std::span(&launches[i], 1), l_.schedule, sm_count, streams.stream_for(i));
    }
  });
  streams.join();
}

// The deconvolution with its epilogue (bias, ReLU, partial statistics): the
// pixel-major GEMM or the phases.
void FusedCall::launch_deconvolution(const DgradOperands& operands, int sm_count, cudaStream_t stream) const {
  if (!l_.pixel_major) {
    const NvtxRange range("cutlassfuse.dgrad_bias_relu_stats");
    launch_phases(operands, sm_count);
    return;
  }
  const NvtxRange range("cutlassfuse.gemm_bias_relu_stats");
  with_math(l_.math, [&](auto m) {
    if constexpr (is_16_bit(decltype(m)::value)) {
      pixel_major_gemm_fused<decltype(m)::value>(l_.conv, operands, sm_count, stream);
    } else {
      TORCH_INTERNAL_ASSERT(false, "the pixel-major GEMM takes 16-bit inputs");
    }
  });
}

ForwardOutputs FusedCall::run() const {
  const OpArgs& a = call_.args;
  const Problem& p = call_.problem;
  const NvtxRange op_range("cutlassfuse.conv_transpose3d_relu_group_norm");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const ElementType element = activation_element(l_.math);
  const auto options = a.input.options();
  const Problem& c = l_.conv;
  const GroupNormShape shape = group_norm_shape(p);
  const int64_t element_bytes = a.input.element_size();

  // Channels-last output of an NDHWC activation is normalized in place: each element
  // is read and written by the same thread, after the statistics are complete.
  const at::MemoryFormat format = output_memory_format(a.input, a.weight);
  const bool channels_last = format == at::MemoryFormat::ChannelsLast3d;
  // A call keeping what its backward reads has the kernels write its activation: in
  // pixel order (NDHWC), or in the pixel-shuffle GEMM's space-to-depth order, kept as it
  // is (KeptTensor::kActivationSpaceToDepth) or copied to pixel order by the finishing
  // kernel as it normalizes.
  const bool keep = call_.keep_for_backward;
  const bool shuffled = !l_.order.identity();
  TORCH_INTERNAL_ASSERT(shuffled || !keeps_space_to_depth(), "space-to-depth order is the pixel-shuffle GEMM's");
  const bool in_place = channels_last && !shuffled && !keep;
  const std::vector<int64_t> size{p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]};
  ForwardOutputs result;
  result.out = empty_on_device(size, options, format);
  const at::Tensor& out = result.out;
  if (keep) {
    result.kept = keeps_space_to_depth() ? empty_on_device({p.batch, p.input_size[0], p.input_size[1], p.input_size[2],
                                                            p.stride[0], p.stride[1], p.stride[2], p.out_channels},
                                                           options)
                                         : empty_on_device(size, options, at::MemoryFormat::ChannelsLast3d);
    result.mean = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
    result.rstd = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
  }

  CallWorkspace workspace;
  const LeftOperand left(a.input, l_.math, p, l_.pixel_major, workspace);
  const bool activation_kept_as_written = keep && (!shuffled || keeps_space_to_depth());
  const auto activation_region = in_place || activation_kept_as_written
                                     ? std::nullopt
                                     : std::optional(workspace.reserve(c.output_numel() * element_bytes));
  static_assert(sizeof(WelfordPartial) == 3 * sizeof(float));
  const auto partials_region = workspace.reserve(l_.slots * static_cast<int64_t>(sizeof(WelfordPartial)));
  const auto scale_shift_region = workspace.reserve(group_norm_scale_shift_bytes(shape));
  const auto counters_region =
      workspace.reserve(group_norm_finish_counters(p.batch) * static_cast<int64_t>(sizeof(int)));
  const auto unit_counters_region = workspace.reserve(unit_counters_bytes());
  const auto scales_region =
      scales_operands(l_.math) ? std::optional(workspace.reserve(sizeof(Tf32OperandScales))) : std::nullopt;
  // The GEMM's columns are blocks of Cout channels: each needs the bias (repeated here
  // unless the caller passed it repeated).
  const bool block_bias = present(a.bias) && l_.blocks() > 1 && !present(a.packed_bias);
  const auto block_bias_region =
      block_bias ? std::optional(workspace.reserve(c.out_channels * element_bytes)) : std::nullopt;
  workspace.allocate(options);

  const at::Tensor packed = packed_filter(a);
  Tf32OperandScales* scales = scales_region ? workspace.at<Tf32OperandScales>(*scales_region) : nullptr;
  if (scales) {
    const NvtxRange range("cutlassfuse.measure_tf32_operands");
    measure_tf32_operands(left.source().data_ptr(), left.source().numel(), packed.data_ptr(), packed.numel(), scales,
                          stream);
  }
  const void* input = left.prepare(workspace, scales, stream);
  const at::Tensor filter = right_operand(packed, l_.math, scales, stream);
  StatisticsSources sources = l_.sources;
  std::optional<at::Tensor> bias, gamma, beta;
  sources.bias = data_or_null(a.bias, bias);
  const void* epilogue_bias = l_.blocks() > 1 && present(a.packed_bias) ? a.packed_bias->data_ptr() : sources.bias;
  if (block_bias) {
    epilogue_bias = workspace.at(*block_bias_region);
    repeat_row(sources.bias, p.out_channels * element_bytes, l_.blocks(), workspace.at(*block_bias_region), stream);
  }
  void* activation = activation_kept_as_written ? result.kept.data_ptr()
                     : in_place                 ? out.data_ptr()
                                                : workspace.at(*activation_region);
  auto* partials = workspace.at<WelfordPartial>(partials_region);
  if (l_.subpixel.unreached_pixels > 0) {
    const NvtxRange range("cutlassfuse.fill_unreached_pixels");
    fill_unreached_pixels(element, activation, sources.bias, p, stream);
  }
  auto* counters = workspace.at<int>(counters_region);
  auto* unit_counters = workspace.at<UnitCounter>(unit_counters_region);
  const float* descale = scales ? &scales->descale : nullptr;
  const DgradOperands operands{input,    filter.data_ptr(), epilogue_bias, activation,
                               partials, counters,          unit_counters, descale};
  const GroupNormAffine affine{data_or_null(a.norm_weight, gamma), data_or_null(a.norm_bias, beta),
                               *affine_element_type(a)};
  StatisticsFinalize finalize = statistics_finalize(partials, sources, element, shape, affine,
                                                    static_cast<float>(p.eps), workspace.at(scale_shift_region));
  if (keep) {
    finalize.mean = result.mean.data_ptr<float>();
    finalize.rstd = result.rstd.data_ptr<float>();
  }
  launch_deconvolution(operands, sm_count, stream);

  const NvtxRange range("cutlassfuse.group_norm_finish");
  if (!channels_last && !shuffled &&
      group_norm_finish_bulk_takes(element, p.out_channels, shape.spatial, activation, out.data_ptr())) {
    group_norm_finish_bulk(finalize, counters, activation, shape.spatial, out.data_ptr(), stream);
  } else {
    group_norm_finish(finalize, counters, activation, l_.order, shape.spatial, channels_last, out.data_ptr(),
                      keep && !activation_kept_as_written ? result.kept.data_ptr() : nullptr, stream);
  }
  return result;
}

}  // namespace

Routing plan_fused_call(const Call& call) {
  const OpArgs& a = call.args;
  const Problem& p = call.problem;
  if (!call.options.backend.fused_path) return "the fused path is turned off (cutlassfuse.backends fused_path=False)";
  if (call.kept == KeptTensor::kConvOutput)
    return "the backward reads the convolution's output, which the fused kernels do not keep";
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(a.input.device().index());
  if (props->major != 9 || props->minor != 0)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) + ", the fused kernels need sm_90";
  const auto element = element_type(a.input.scalar_type());
  if (!element) return "dtype is not float16, bfloat16 or float32";
  const auto math = tensor_core_math(*element, call.options.float32_mode);
  if (!math) return "float32 mode is 'pytorch' (the convolution as PyTorch runs it; cutlassfuse.set_float32_mode)";
  if (!affine_element_type(a)) return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  if (p.batch == 0) return "empty batch";
  // TMA reads the input (when no copy of it is made) and the filter (when the weight is
  // already in its layout) at their own addresses.
  if (!aligned_for_tma(a.input) || !aligned_for_tma(present(a.packed_weight) ? *a.packed_weight : a.weight))
    return "input or weight data not 16-byte aligned (a view at an offset; TMA needs aligned addresses)";
  if (const char* why = group_norm_unsupported_reason(group_norm_shape(p)); *why != '\0') return why;
  Launches launches = describe_launches(call, *math);
  if (std::string why = unsupported_reason(call, launches); !why.empty()) return why;
  place_partials(launches, p);
  return std::make_unique<FusedCall>(call, std::move(launches));
}

}  // namespace cutlassfuse::sm90
