// Arguments, checks and launch of the sm90 fused dgrad family, expanded once per math mode
// by its translation unit (dgrad.cu), and shared with the pixel-major GEMM (in dgrad.cu
// too) and the plain-store baseline (dgrad_plain.cu).
#pragma once

#include <cutlass/cutlass.h>

#include <algorithm>
#include <array>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "cutlassfuse/sm90/conv_output_stride.cuh"
#include "cutlassfuse/sm90/dgrad.h"
#include "cutlassfuse/sm90/dgrad_kernel.cuh"

namespace cutlassfuse::sm90 {

// ConvTranspose3d is the dgrad of the Conv3d that maps our output y (Cout channels)
// back to our input x (Cin channels). One phase is a unit-stride dgrad over views:
// CUTLASS's "activation" is the phase's output view, its "transformed activation" the
// input view, its filter the phase's taps; all strides are passed explicitly, so the
// views need no copies. (CUTLASS derives the input extent from the others; the plan
// guarantees it equals the view's.)
inline DgradShape make_problem_shape(const Problem& p, const PhaseProblem& phase) {
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  auto strides = [](const StridedView& v) {
    return DgradShape::TensorStride{v.stride[0], v.stride[1], v.stride[2], v.stride[3], 1};
  };
  auto triple = [&](const Extent3& e) { return DgradShape::SpatialExtent{i32(e[0]), i32(e[1]), i32(e[2])}; };
  const Extent3& out = phase.output.extent;
  const Extent3& taps = phase.filter.extent;
  return DgradShape(
      cutlass::conv::Mode::kCrossCorrelation,
      DgradShape::TensorExtent{i32(p.batch), i32(out[0]), i32(out[1]), i32(out[2]), i32(p.out_channels)},
      strides(phase.output),
      DgradShape::TensorExtent{i32(p.in_channels), i32(taps[0]), i32(taps[1]), i32(taps[2]), i32(p.out_channels)},
      strides(phase.filter), strides(phase.input), triple(phase.lower_padding), triple(phase.upper_padding),
      DgradShape::SpatialExtent{1, 1, 1}, triple(phase.dilation),
      /*groups=*/1);
}

// The phase's views applied to the whole tensors.
template <class ElementIn, class ElementOut>
struct PhasePointers {
  const ElementIn* input;
  const ElementIn* filter;
  ElementOut* output;

  PhasePointers(const PhaseProblem& phase, const void* input, const void* filter, void* output)
      : input(static_cast<const ElementIn*>(input) + (input ? phase.input.offset : 0)),
        filter(static_cast<const ElementIn*>(filter) + (filter ? phase.filter.offset : 0)),
        output(static_cast<ElementOut*>(output) + (output ? phase.output.offset : 0)) {}
};

// The epilogue tree's arguments (they nest as the tree: {child arguments..., node
// arguments}): the descale factor where the tree has one, the bias, and the statistics
// of `gn` into ops.partials, laid out as TilePartials of the kernel's tile.
template <class Fused>
typename Fused::Epilogue::FusionCallbacks::Arguments tree_arguments(const GroupNormShape& gn,
                                                                    const DgradOperands& ops) {
  using ElementOut = typename Fused::Epilogue::ElementD;
  constexpr int kTileM = cute::size<0>(typename Fused::TileShape{});
  constexpr int kTileN = cute::size<1>(typename Fused::TileShape{});
  const TilePartials tiles = TilePartials::for_tiles(gn, kTileM, kTileN);
  const GroupNormStatsArguments stats{ops.partials,
                                      gn.spatial,
                                      static_cast<int>(gn.channels / gn.num_groups),
                                      tiles.max_segments,
                                      tiles.max_local_groups,
                                      tiles.tiles_n,
                                      ops.finish_counters,
                                      ops.finish_counters ? group_norm_finish_counters(gn.batch) : 0};
  const typename Fused::Trees::Bias::Arguments bias{static_cast<const ElementOut*>(ops.bias), ElementOut(0), {}};
  if constexpr (Fused::Trees::kDescaled) {
    const typename Fused::Trees::Descale::Arguments descale{{1.f}, {ops.descale}, {}};
    return {{{descale, {}, bias, {}}, {}}, stats};
  } else {
    return {{{{}, bias, {}}, {}}, stats};
  }
}

template <class Fused>
PhaseArguments<DgradShape, typename Fused::Mainloop, typename Fused::Epilogue> make_arguments(
    const Problem& problem, const PhaseProblem& phase, const DgradOperands& ops) {
  using ElementIn = typename Fused::Mainloop::ElementA;
  using ElementOut = typename Fused::Epilogue::ElementD;
  using StrideD = typename Fused::Epilogue::StrideD;
  const DgradShape shape = make_problem_shape(problem, phase);
  const StrideD stride_d = output_stride<StrideD>(shape);
  const PhasePointers<ElementIn, ElementOut> ptr(phase, ops.input, ops.filter, ops.activation);
  const auto tree = tree_arguments<Fused>(phase_group_norm_shape(problem, phase), ops);
  return {shape, {ptr.input, ptr.filter}, {tree, nullptr, stride_d, ptr.output, stride_d}};
}

// Rules of this kernel beyond CUTLASS's own can_implement.
inline std::string shape_rules_violation(const Problem& p) {
  if (p.conv_groups != 1) return "grouped convolution";
  if (p.in_channels % 8 != 0 || p.out_channels % 8 != 0)
    return "channel counts not multiples of 8 (TMA needs 16-byte aligned channel rows)";
  // CUTLASS's conv problem shape and TMA descriptors take 32-bit extents.
  constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;
  if (p.output_numel() > kMax32 || p.input_numel() > kMax32) return "more than 2^31 elements";
  return {};
}

// Empty when CUTLASS's collectives take the phase: the input extent they derive matches
// the view's, and their can_implement (TMA im2col limits on padding, dilation, filter
// extent) agrees.
template <class Mainloop, class Epilogue>
std::string phase_rejection(const PhaseProblem& phase, const PhaseArguments<DgradShape, Mainloop, Epilogue>& args) {
  for (int i = 0; i < 3; ++i) {
    if (args.shape.shape_A[i + 1] != phase.input.extent[i]) return "input extent does not match the dgrad problem";
  }
  if (!collectives_can_implement(args))
    return "CUTLASS can_implement rejected a phase (TMA im2col limits: padding <= 16, (kernel - 1) * dilation < 31)";
  return {};
}

template <class Fused>
std::string unsupported_reason(const Problem& problem, const PhaseProblem& phase) {
  if (std::string why = shape_rules_violation(problem); !why.empty()) return why;
  WelfordPartial placeholder{};
  const DgradOperands no_tensors{nullptr, nullptr, nullptr, nullptr, &placeholder};
  return phase_rejection(phase, make_arguments<Fused>(problem, phase, no_tensors));
}

inline void throw_on_failure(bool failed, const char* what, const char* status) {
  const cudaError_t launch = cudaGetLastError();
  if (failed || launch != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: CUTLASS dgrad ") + what + " failed: " + status + " / " +
                             cudaGetErrorString(launch));
  }
}

// The ping-pong kernel's parameters of `phases`: up to kMaxPhasesPerLaunch per launch,
// scheduled as `schedule` says. `counters`: one UnitCounter per phase (a launch takes
// its first phase's), or nullptr for the static walk.
template <class Kernel, class Arguments>
std::vector<typename Kernel::Params> pingpong_launch_params(const std::vector<Arguments>& phases, UnitCounter* counters,
                                                            const ScheduleOptions& schedule) {
  if (!schedule.drawn_tile_schedule) counters = nullptr;
  std::vector<typename Kernel::Params> params;
  for (size_t first = 0; first < phases.size(); first += kMaxPhasesPerLaunch) {
    const size_t count = std::min(phases.size() - first, static_cast<size_t>(kMaxPhasesPerLaunch));
    params.push_back(Kernel::to_underlying_arguments(phases.data() + first, static_cast<int>(count),
                                                     schedule.skip_border_taps, counters ? counters + first : nullptr));
  }
  return params;
}

// Launches the ping-pong kernel's `launches` (their parameters) on `stream`.
template <class Kernel>
void launch_pingpong(const std::vector<typename Kernel::Params>& launches, int sm_count, cudaStream_t stream) {
  for (const auto& params : launches) {
    const cudaError_t e = Kernel::launch(params, sm_count, stream);
    throw_on_failure(e != cudaSuccess, "ping-pong launch", cudaGetErrorString(e));
  }
}

// The ping-pong kernel's parameters of a call's launches, kept for the calls that repeat
// them. Encoding a phase's TMA descriptors and epilogue parameters costs the host a few
// microseconds, eight times over for 3-D stride 2, which left multi-phase calls with
// half as much host time as GPU time; a layer's calls repeat its problem and, through
// the caching allocator, its tensors' addresses. The parameters are a function of the
// device, the problem, each launched phase with its operands, and the schedule: the
// key. A few entries per thread and kernel type, replaced round-robin.
template <class Params>
class LaunchParamsCache {
 public:
  template <class Build>
  const std::vector<Params>& get(const Problem& problem, std::span<const PhaseLaunch> phases,
                                 const ScheduleOptions& schedule, Build&& build) {
    int device = -1;
    cudaGetDevice(&device);
    for (const Entry& entry : entries_) {
      if (entry.matches(device, schedule, problem, phases)) return entry.params;
    }
    // Built before the entry is touched: a build that throws leaves no entry whose key
    // promises parameters it does not hold.
    Entry fresh{device, schedule, problem, {}, build()};
    for (const PhaseLaunch& launch : phases) fresh.phases.push_back({*launch.phase, launch.operands});
    Entry& entry = entries_[next_++ % entries_.size()];
    entry = std::move(fresh);
    return entry.params;
  }

 private:
  struct LaunchedPhase {
    PhaseProblem phase;
    DgradOperands operands;
  };
  struct Entry {
    int device = -1;
    ScheduleOptions schedule;
    Problem problem;
    std::vector<LaunchedPhase> phases;
    std::vector<Params> params;

    bool matches(int on_device, const ScheduleOptions& s, const Problem& p,
                 std::span<const PhaseLaunch> launches) const {
      if (device != on_device || !(schedule == s) || !(problem == p) || phases.size() != launches.size()) return false;
      for (size_t i = 0; i < launches.size(); ++i) {
        if (!(phases[i].phase == *launches[i].phase) || !(phases[i].operands == launches[i].operands)) return false;
      }
      return true;
    }
  };
  std::array<Entry, 8> entries_;
  size_t next_ = 0;
};

template <class Fused>
void run(const Problem& problem, std::span<const PhaseLaunch> phases, const ScheduleOptions& schedule, int sm_count,
         cudaStream_t stream) {
  using Kernel = typename Fused::Kernel;
  auto arguments = [&] {
    std::vector<PhaseArguments<DgradShape, typename Fused::Mainloop, typename Fused::Epilogue>> args;
    for (const PhaseLaunch& launch : phases) {
      args.push_back(make_arguments<Fused>(problem, *launch.phase, launch.operands));
    }
    return args;
  };
  thread_local LaunchParamsCache<typename Kernel::Params> cache;
  const auto& launches = cache.get(problem, phases, schedule, [&] {
    return pingpong_launch_params<Kernel>(arguments(), phases.front().operands.unit_counter, schedule);
  });
  launch_pingpong<Kernel>(launches, sm_count, stream);
}

// One configuration enum value -> one kernel type.
template <class ElementIn, class ElementOut, bool kDescaled, class F>
decltype(auto) with_kernel(DgradConfig config, F&& f) {
  switch (config) {
    case DgradConfig::k128x64_pingpong:
      return f(DgradFusedKernel<ElementIn, ElementOut, TileConfig<128, 64, 1>, kDescaled>{});
    case DgradConfig::k128x128_pingpong_cluster2x1:
      return f(DgradFusedKernel<ElementIn, ElementOut, TileConfig<128, 128, 2>, kDescaled>{});
    default: return f(DgradFusedKernel<ElementIn, ElementOut, TileConfig<128, 128, 1>, kDescaled>{});
  }
}

}  // namespace cutlassfuse::sm90

// Defines the family's two entry points for one math mode (MATH_MODE), run with
// CUTLASS_IN operands and a CUTLASS_OUT activation.
#define CUTLASSFUSE_DEFINE_DGRAD_FAMILY(MATH_MODE, CUTLASS_IN, CUTLASS_OUT)                                    \
  namespace cutlassfuse::sm90 {                                                                                \
  template <>                                                                                                  \
  std::string dgrad_unsupported_reason<MATH_MODE>(DgradConfig config, const Problem& problem,                  \
                                                  const PhaseProblem& phase) {                                 \
    return with_kernel<CUTLASS_IN, CUTLASS_OUT, scales_operands(MATH_MODE)>(                                   \
        config, [&](auto fused) { return unsupported_reason<decltype(fused)>(problem, phase); });              \
  }                                                                                                            \
  template <>                                                                                                  \
  void dgrad_fused<MATH_MODE>(DgradConfig config, const Problem& problem, std::span<const PhaseLaunch> phases, \
                              const ScheduleOptions& schedule, int sm_count, cudaStream_t stream) {            \
    with_kernel<CUTLASS_IN, CUTLASS_OUT, scales_operands(MATH_MODE)>(                                          \
        config, [&](auto fused) { run<decltype(fused)>(problem, phases, schedule, sm_count, stream); });       \
  }                                                                                                            \
  }
