// The fused sm90 path of the op's CUDA kernel: per sub-pixel phase (or one
// pixel-shuffle GEMM), a CUTLASS dgrad whose epilogue adds the bias, applies ReLU and
// reduces GroupNorm partial statistics; then finalize and normalize. Calls it does not
// take go to the fallback (fallback_cuda.cpp) or ATen (registration.cpp decides).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/float32_split.h"
#include "cutlassfuse/group_norm.h"
#include "cutlassfuse/layout.h"
#include "cutlassfuse/nvtx.h"
#include "cutlassfuse/op.h"
#include "cutlassfuse/settings.h"
#include "cutlassfuse/subpixel.h"
#include "cutlassfuse/unreached_fill.h"
#include "op_arguments.h"

namespace cutlassfuse {
namespace {

std::atomic<bool> g_fused_path_enabled{true};
std::atomic<int> g_phase_streams{1};

// Sub-pixel phases are independent (disjoint outputs, their own partials): with more
// than one lane each phase is its own launch on a side stream, so one phase's last
// wave can overlap the next phase's first (the ping-pong kernel does this inside one
// launch). Forked from and joined back into the caller's stream, so the op stays
// ordered on it (and capturable in a CUDA graph); the tensors the phases use outlive
// the join. One lane (the default) launches everything on the caller's stream. The
// destructor joins too: when a launch throws, the call's workspace goes back to the
// caching allocator as the exception unwinds, and the caller's stream must not reuse it
// before the side streams' kernels that read it have finished.
class PhaseLanes {
 public:
  PhaseLanes(size_t phases, const at::cuda::CUDAStream& caller) : caller_(caller) {
    const size_t lanes = std::min<size_t>(static_cast<size_t>(std::max(g_phase_streams.load(), 1)), phases);
    if (lanes <= 1) return;
    at::cuda::CUDAEvent forked;
    forked.record(caller_);
    for (size_t i = 0; i < lanes; ++i) {
      side_.push_back(at::cuda::getStreamFromPool(/*isHighPriority=*/false, caller_.device_index()));
      forked.block(side_.back());
    }
  }

  PhaseLanes(const PhaseLanes&) = delete;
  PhaseLanes& operator=(const PhaseLanes&) = delete;

  ~PhaseLanes() {
    try {
      join();
    } catch (...) {  // already unwinding from a failed launch, whose error is the one to report
    }
  }

  size_t count() const { return std::max<size_t>(side_.size(), 1); }

  cudaStream_t stream_for(size_t phase) const {
    return side_.empty() ? caller_.stream() : side_[phase % side_.size()].stream();
  }

  // Idempotent: the caller's stream waits once for every side stream.
  void join() {
    for (const at::cuda::CUDAStream& side : side_) {
      at::cuda::CUDAEvent done;
      done.record(side);
      done.block(caller_);
    }
    side_.clear();
  }

 private:
  at::cuda::CUDAStream caller_;
  std::vector<at::cuda::CUDAStream> side_;
};

// Calls f with the element type as a compile-time constant.
template <class F>
decltype(auto) with_element(ElementType element, F&& f) {
  switch (element) {
    case ElementType::kBFloat16: return f(std::integral_constant<ElementType, ElementType::kBFloat16>{});
    case ElementType::kFloat32: return f(std::integral_constant<ElementType, ElementType::kFloat32>{});
    default: return f(std::integral_constant<ElementType, ElementType::kFloat16>{});
  }
}

// The call's temporaries carved from one allocation: on the GPU machine an allocation
// from the caching allocator costs several microseconds of host time, and calls of the
// small shapes are bound by the host. Reserve every region, then allocate once.
class CallWorkspace {
 public:
  using Region = int64_t;  // byte offset

  Region reserve(int64_t bytes) {
    const Region region = bytes_;
    bytes_ += ceil_div(bytes, kAlignment) * kAlignment;
    return region;
  }

  void allocate(const at::TensorOptions& options) { buffer_ = at::empty({bytes_}, options.dtype(at::kByte)); }

  template <class T = void>
  T* at(Region region) const {
    return reinterpret_cast<T*>(static_cast<char*>(buffer_.data_ptr()) + region);
  }

 private:
  // TMA wants 128-byte aligned tensors; 256 keeps every region on its own cache lines.
  static constexpr int64_t kAlignment = 256;

  at::Tensor buffer_;
  int64_t bytes_ = 0;
};

// The deconvolution's left operand: the input itself when the kernel reads its layout
// (channels-last, or NCDHW for the pixel-major GEMM); else NDHWC from one pass of our
// transpose kernel (ATen's permuted copy is 5x slower on this pattern); float32 as
// bfloat16 piece products in one GEMM over kProducts * Cin channels (float32_split.h),
// split by one kernel (the filter's split, small next to the input, runs through ATen
// in split_filter).
class LeftOperand {
 public:
  LeftOperand(const at::Tensor& input, ElementType element, const Problem& p, bool pixel_major,
              CallWorkspace& workspace)
      : input_(input), element_(element), problem_(p),
        channels_last_(input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
    if (element == ElementType::kFloat32) {
      converted_ = workspace.reserve(p.input_numel() * float32_split::kProducts * c10::elementSize(at::kBFloat16));
    } else if (!channels_last_ && !pixel_major) {
      converted_ = workspace.reserve(input.nbytes());
    }
  }

  // The operand's data, converted on `stream` if needed; after workspace.allocate().
  const void* prepare(const CallWorkspace& workspace, cudaStream_t stream) const {
    if (!converted_) return input_.data_ptr();
    const at::Tensor src = channels_last_ ? input_ : input_.contiguous();
    void* dst = workspace.at(*converted_);
    const Problem& p = problem_;
    if (element_ == ElementType::kFloat32) {
      const NvtxRange range("cutlassfuse.split_float32");
      split_float32_ndhwc(src.data_ptr(), channels_last_, dst, p.batch, p.in_channels, p.input_spatial(), stream);
    } else {
      const NvtxRange range("cutlassfuse.ncdhw_to_ndhwc");
      ncdhw_to_ndhwc(element_, src.data_ptr(), dst, p.batch, p.in_channels, p.input_spatial(), stream);
    }
    return dst;
  }

 private:
  const at::Tensor& input_;
  ElementType element_;
  const Problem& problem_;
  bool channels_last_;
  std::optional<CallWorkspace::Region> converted_;
};

// The packed filter [Cin, T, R, S, Cout] as the right operand: block b along Cin holds
// piece filter_piece(b).
at::Tensor split_filter(const at::Tensor& packed) {
  std::array<at::Tensor, float32_split::kPieces> pieces;
  at::Tensor rest = packed;
  for (auto& piece : pieces) {
    piece = rest.to(at::kBFloat16);
    // A non-finite value is all in its first piece (inf - inf would make the rest NaN).
    rest = at::nan_to_num(rest - piece.to(at::kFloat), 0.0, 0.0, 0.0);
  }
  std::vector<at::Tensor> blocks;
  for (int block = 0; block < float32_split::kProducts; ++block) {
    blocks.push_back(pieces[float32_split::filter_piece(block)]);
  }
  return at::cat(blocks, 0);
}

// The launches of one call. `conv` is what the CUTLASS launches compute: the call's
// own problem as sub-pixel phases, or, when kernel == stride, its pixel-shuffle GEMM
// (one launch writing the activation in space-to-depth order), which reads an NCDHW
// 16-bit input as it is when it can (pixel_major). Each launch's partials get a
// region, one per block of channels for the GEMM, in a fixed order.
struct FusedPlan {
  Problem conv;
  bool pixel_major = false;
  SubpixelPlan subpixel;
  PixelShuffle order;
  sm90::DgradConfig config;
  StatisticsSources sources;
  int64_t slots = 0;

  int64_t blocks() const { return int64_t{order.block[0]} * order.block[1] * order.block[2]; }
};

// The pixel-major GEMM takes NCDHW (contiguous) 16-bit inputs of a pixel-shuffle GEMM
// whose rows TMA can address (pixels per sample a multiple of 8).
bool reads_pixel_major(const at::Tensor& input, ElementType element, const Problem& gemm) {
  if (!input.is_contiguous()) return false;
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return false;  // also NCDHW-contiguous when C or DHW is 1
  return with_element(element, [&](auto e) {
    if constexpr (decltype(e)::value == ElementType::kFloat32) {
      return false;
    } else {
      return sm90::pixel_major_gemm_unsupported_reason<decltype(e)::value>(gemm).empty();
    }
  });
}

FusedPlan describe_launches(const Problem& p, const at::Tensor& input, ElementType element) {
  FusedPlan plan;
  plan.conv = is_pixel_shuffle_gemm(p) ? pixel_shuffle_gemm_problem(p) : p;
  if (element == ElementType::kFloat32) plan.conv.in_channels *= float32_split::kProducts;
  plan.subpixel = plan_subpixel(plan.conv);
  // The pixel-major GEMM is the 128x128 ping-pong configuration (clusters of one) for
  // NCDHW input: a pinned configuration (set_dgrad_config) other than that runs as pinned.
  const auto pinned = sm90::config_override();
  plan.pixel_major = is_pixel_shuffle_gemm(p) && (!pinned || *pinned == sm90::DgradConfig::k128x128_pingpong) &&
                     reads_pixel_major(input, element, plan.conv);
  plan.config = plan.pixel_major ? sm90::DgradConfig::k128x128_pingpong : sm90::choose_config(plan.conv);
  if (plan.conv.out_channels != p.out_channels) {
    for (int i = 0; i < 3; ++i) {
      plan.order.block[i] = static_cast<int>(p.stride[i]);
      plan.order.output_size[i] = static_cast<int>(p.output_size[i]);
    }
  }
  return plan;
}

int64_t regions_needed(const FusedPlan& plan) {
  return static_cast<int64_t>(plan.subpixel.phases.size()) * plan.blocks();
}

// Gives every launch's partials their region of the workspace, in launch order.
void place_partials(FusedPlan& plan, const Problem& p) {
  TORCH_INTERNAL_ASSERT(regions_needed(plan) <= kMaxPartialsRegions);
  const sm90::TileExtent tile = plan.pixel_major ? sm90::kPixelMajorGemmTile : sm90::tile_extent(plan.config);
  for (const PhaseProblem& phase : plan.subpixel.phases) {
    GroupNormShape shape = sm90::phase_group_norm_shape(plan.conv, phase);
    if (plan.pixel_major) shape.spatial = sm90::pixel_major_statistics_rows(shape.spatial);
    const TilePartials tiles = TilePartials::for_tiles(shape, tile.m, tile.n);
    for (int64_t block = 0; block < plan.blocks(); ++block) {
      plan.sources.regions[plan.sources.region_count++] = {tiles, shape.spatial, plan.slots,
                                                           static_cast<int>(block * p.num_groups)};
    }
    plan.slots += tiles.slots(shape);
  }
  plan.sources.unreached_pixels = plan.subpixel.unreached_pixels;
}

// The filter [Cin, T, R, S, Cout]: the caller's pre-packed copy when given (the module
// caches one per weight version), else permuted here.
at::Tensor filter_of(const OpArgs& a) {
  if (present(a.packed_weight)) return a.packed_weight->contiguous();
  return a.weight.permute({0, 2, 3, 4, 1}).contiguous();
}

// The CUTLASS dgrad launches of every sub-pixel phase (one phase for stride 1 and for
// the pixel-shuffle GEMM), each phase reading and writing its views of `operands`.
void launch_phases(const FusedPlan& plan, const sm90::DgradOperands& operands, ElementType element, int sm_count) {
  std::vector<sm90::PhaseLaunch> launches;
  for (size_t i = 0; i < plan.subpixel.phases.size(); ++i) {
    sm90::DgradOperands phase_operands = operands;
    phase_operands.partials += plan.sources.regions[i * plan.blocks()].first_slot;
    phase_operands.unit_counter += i;
    launches.push_back({&plan.subpixel.phases[i], phase_operands});
  }
  PhaseLanes lanes(launches.size(), at::cuda::getCurrentCUDAStream());
  with_element(element, [&](auto e) {
    if (lanes.count() <= 1) {
      sm90::dgrad_fused<decltype(e)::value>(plan.config, plan.conv, launches, sm_count, lanes.stream_for(0));
      return;
    }
    for (size_t i = 0; i < launches.size(); ++i) {
      sm90::dgrad_fused<decltype(e)::value>(plan.config, plan.conv, std::span(&launches[i], 1), sm_count,
                                            lanes.stream_for(i));
    }
  });
  lanes.join();
}

// The deconvolution with its epilogue (bias, ReLU, partial statistics) of `plan`:
// the pixel-major GEMM or the phases.
void launch_deconvolution(const FusedPlan& plan, const sm90::DgradOperands& operands, ElementType element, int sm_count,
                          cudaStream_t stream) {
  if (!plan.pixel_major) {
    const NvtxRange range("cutlassfuse.dgrad_bias_relu_stats");
    launch_phases(plan, operands, element, sm_count);
    return;
  }
  const NvtxRange range("cutlassfuse.gemm_bias_relu_stats");
  with_element(element, [&](auto e) {
    if constexpr (decltype(e)::value == ElementType::kFloat32) {
      TORCH_INTERNAL_ASSERT(false, "the pixel-major GEMM takes 16-bit inputs");
    } else {
      sm90::pixel_major_gemm_fused<decltype(e)::value>(plan.conv, operands, sm_count, stream);
    }
  });
}

bool aligned_for_tma(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// The ping-pong launches' unit counters (unit_schedule.cuh): one per phase, the most a
// call has, so that every launch of a call (phase streams run them at once) has its own.
int64_t unit_counters_bytes() { return kMaxPartialsRegions * static_cast<int64_t>(sizeof(sm90::UnitCounter)); }

}  // namespace

void set_fused_path_enabled(bool enabled) { g_fused_path_enabled.store(enabled); }

void set_phase_streams(int64_t lanes) { g_phase_streams.store(static_cast<int>(std::clamp<int64_t>(lanes, 1, 8))); }

namespace {

// The call's launches, or why the fused path does not take the call.
std::variant<FusedPlan, std::string> route(const OpArgs& a, const Problem& p) {
  if (!g_fused_path_enabled.load()) return "the fused path is turned off (cutlassfuse.set_fused_path_enabled)";
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(a.input.device().index());
  if (props->major != 9 || props->minor != 0)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) + ", the fused kernels need sm_90";
  const auto element = element_type(a.input.scalar_type());
  if (!element) return "dtype is not float16, bfloat16 or float32";
  if (*element == ElementType::kFloat32 && float32_mode() != Float32Mode::kBf16x3)
    return "float32 mode is 'pytorch' (the convolution as PyTorch runs it; cutlassfuse.set_float32_mode)";
  if (!affine_element_type(a)) return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  if (p.batch == 0) return "empty batch";
  // TMA reads the input (when no copy of it is made) and the filter (when the weight is
  // already in its layout) at their own addresses; CUTLASS's can_implement checks shapes
  // only, and a misaligned address would make a descriptor that faults or reads garbage.
  if (!aligned_for_tma(a.input) || !aligned_for_tma(present(a.packed_weight) ? *a.packed_weight : a.weight))
    return "input or weight data not 16-byte aligned (a view at an offset; TMA needs aligned addresses)";
  if (const char* why = group_norm_unsupported_reason(group_norm_shape(p)); *why != '\0') return why;
  FusedPlan plan = describe_launches(p, a.input, *element);
  if (plan.subpixel.phases.empty()) return "no input reaches the output (every pixel is ReLU(bias))";
  if (regions_needed(plan) > kMaxPartialsRegions) return "more than 64 sub-pixel phases (stride product above 64)";
  if (!plan.pixel_major) {
    for (const PhaseProblem& phase : plan.subpixel.phases) {
      std::string why = with_element(*element, [&](auto e) {
        return sm90::dgrad_unsupported_reason<decltype(e)::value>(plan.config, plan.conv, phase);
      });
      if (!why.empty()) return why;
    }
  }
  place_partials(plan, p);
  return plan;
}

}  // namespace

std::string fused_path_unsupported_reason(const OpArgs& a, const Problem& p) {
  auto routed = route(a, p);
  return std::holds_alternative<std::string>(routed) ? std::get<std::string>(std::move(routed)) : std::string();
}

std::string fused_path_description(const OpArgs& a, const Problem& p) {
  const ElementType element = *element_type(a.input.scalar_type());
  const FusedPlan plan = describe_launches(p, a.input, element);
  std::string launches = "CUTLASS sm90 dgrad ";
  if (plan.pixel_major) {
    launches = "pixel-shuffle GEMM (kernel == stride; one launch for " + std::to_string(plan.blocks()) +
               " output blocks) reading the NCDHW input as it is: CUTLASS sm90 GEMM, M-major input, batched over "
               "samples, 128x128_pingpong (epilogue: bias, ReLU, GroupNorm partial statistics) + normalize";
    return launches;
  }
  if (plan.blocks() > 1) {
    launches = "pixel-shuffle GEMM (kernel == stride; one launch for " + std::to_string(plan.blocks()) +
               " output blocks) of CUTLASS sm90 dgrad ";
  } else if (plan.subpixel.phases.size() > 1) {
    launches = std::to_string(plan.subpixel.phases.size()) + " sub-pixel phases of CUTLASS sm90 dgrad ";
  }
  if (plan.subpixel.unreached_pixels > 0) launches = "ReLU(bias) fill of unreached pixels + " + launches;
  if (element == ElementType::kFloat32) {
    launches = "float32 as three bfloat16 piece products (float32 mode 'bf16x3'): " + launches;
  }
  return launches + sm90::config_name(plan.config) +
         " (epilogue: bias, ReLU, GroupNorm partial statistics) + normalize";
}

std::optional<at::Tensor> fused_forward_cuda(const OpArgs& a, const Problem& p) {
  auto routed = [&] {
    const NvtxRange range("cutlassfuse.route");
    return route(a, p);
  }();
  if (!std::holds_alternative<FusedPlan>(routed)) return std::nullopt;
  FusedPlan& plan = std::get<FusedPlan>(routed);
  const NvtxRange op_range("cutlassfuse.conv_transpose3d_relu_group_norm");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const ElementType element = *element_type(a.input.scalar_type());
  const auto options = a.input.options();
  const Problem& c = plan.conv;
  const GroupNormShape shape = group_norm_shape(p);
  const int64_t element_bytes = a.input.element_size();

  // Channels-last output of an NDHWC activation is normalized in place: each element
  // is read and written by the same thread, after the statistics are complete.
  const at::MemoryFormat format = output_memory_format(a.input, a.weight);
  const bool channels_last = format == at::MemoryFormat::ChannelsLast3d;
  const bool in_place = channels_last && plan.order.identity();
  at::Tensor out = at::empty({p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]},
                             options.memory_format(format));

  CallWorkspace workspace;
  const LeftOperand left(a.input, element, p, plan.pixel_major, workspace);
  const auto activation_region =
      in_place ? std::nullopt : std::optional(workspace.reserve(c.output_numel() * element_bytes));
  static_assert(sizeof(WelfordPartial) == 3 * sizeof(float));
  const auto partials_region = workspace.reserve(plan.slots * static_cast<int64_t>(sizeof(WelfordPartial)));
  const auto scale_shift_region = workspace.reserve(group_norm_scale_shift_bytes(shape));
  const auto counters_region =
      workspace.reserve(group_norm_finish_counters(p.batch) * static_cast<int64_t>(sizeof(int)));
  const auto unit_counters_region = workspace.reserve(unit_counters_bytes());
  // The GEMM's columns are blocks of Cout channels: each needs the bias (repeated here
  // unless the caller passed it repeated).
  const bool block_bias = present(a.bias) && plan.blocks() > 1 && !present(a.packed_bias);
  const auto block_bias_region =
      block_bias ? std::optional(workspace.reserve(c.out_channels * element_bytes)) : std::nullopt;
  workspace.allocate(options);

  const void* input = left.prepare(workspace, stream);
  const at::Tensor filter = element == ElementType::kFloat32 ? split_filter(filter_of(a)) : filter_of(a);
  std::optional<at::Tensor> bias, gamma, beta;
  plan.sources.bias = data_or_null(a.bias, bias);
  const void* epilogue_bias =
      plan.blocks() > 1 && present(a.packed_bias) ? a.packed_bias->data_ptr() : plan.sources.bias;
  if (block_bias) {
    epilogue_bias = workspace.at(*block_bias_region);
    repeat_row(plan.sources.bias, p.out_channels * element_bytes, plan.blocks(), workspace.at(*block_bias_region),
               stream);
  }
  void* activation = in_place ? out.data_ptr() : workspace.at(*activation_region);
  auto* partials = workspace.at<WelfordPartial>(partials_region);
  if (plan.subpixel.unreached_pixels > 0) {
    const NvtxRange range("cutlassfuse.fill_unreached_pixels");
    fill_unreached_pixels(element, activation, plan.sources.bias, p, stream);
  }
  auto* counters = workspace.at<int>(counters_region);
  auto* unit_counters = workspace.at<sm90::UnitCounter>(unit_counters_region);
  const sm90::DgradOperands operands{input,    filter.data_ptr(), epilogue_bias, activation,
                                     partials, counters,          unit_counters};
  const GroupNormAffine affine{data_or_null(a.norm_weight, gamma), data_or_null(a.norm_bias, beta),
                               *affine_element_type(a)};
  const StatisticsFinalize finalize = statistics_finalize(partials, plan.sources, element, shape, affine,
                                                          static_cast<float>(p.eps), workspace.at(scale_shift_region));
  launch_deconvolution(plan, operands, element, sm_count, stream);

  const NvtxRange range("cutlassfuse.group_norm_finish");
  group_norm_finish(finalize, counters, activation, plan.order, shape.spatial, channels_last, out.data_ptr(), stream);
  return out;
}

at::Tensor cutlass_dgrad_plain(const OpArgs& a, const Problem& p) {
  TORCH_CHECK_VALUE(a.input.is_cuda() && at::cuda::getDeviceProperties(a.input.device().index())->major == 9,
                    "cutlassfuse: the plain CUTLASS dgrad runs on sm_90 GPUs only");
  const auto element = element_type(a.input.scalar_type());
  TORCH_CHECK_TYPE(element && *element != ElementType::kFloat32,
                   "cutlassfuse: the plain CUTLASS dgrad takes float16 or bfloat16");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const SubpixelPlan plan = plan_subpixel(p);
  TORCH_CHECK_VALUE(static_cast<int64_t>(plan.phases.size()) <= kMaxPartialsRegions,
                    "cutlassfuse: the plain CUTLASS dgrad takes at most 64 sub-pixel phases");
  CallWorkspace workspace;
  const LeftOperand left(a.input, *element, p, /*pixel_major=*/false, workspace);
  const auto unit_counters_region = workspace.reserve(unit_counters_bytes());
  workspace.allocate(a.input.options());
  auto* unit_counters = workspace.at<sm90::UnitCounter>(unit_counters_region);
  const void* input = left.prepare(workspace, stream);
  const at::Tensor filter = filter_of(a);
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
  const sm90::DgradConfig config = sm90::choose_config(p);
  if (*element == ElementType::kBFloat16) {
    sm90::dgrad_plain<ElementType::kBFloat16>(config, p, launches, sm_count, stream);
  } else {
    sm90::dgrad_plain<ElementType::kFloat16>(config, p, launches, sm_count, stream);
  }
  return out;
}

}  // namespace cutlassfuse
