// Host interface of the Hopper (sm90a) fused deconvolution:
//
//     activation = ReLU(ConvTranspose3d(input, weight) + bias), stored NDHWC,
//     plus GroupNorm partial statistics of the stored values (TilePartials layout),
//
// computed as the data gradient (dgrad) of the Conv3d whose input is `activation`
// and whose output is `input`: a CUTLASS 3.x implicit GEMM (TMA im2col loads, wgmma)
// whose epilogue visitor tree adds the bias, applies ReLU, stores, and reduces the
// statistics (group_norm_stats_visitor.cuh). The kernel is unit-stride: one launch
// runs one sub-pixel phase (subpixel.h), reading views of the input and filter and
// writing a strided view of the activation; stride 1 is a single phase.
// GEMM view of a phase: M = batch * pixels of the phase, N = out_channels,
// K = in_channels * taps of the phase. Each entry point is instantiated per math mode
// (math_mode.h): float16 and bfloat16 run in their own type; float32 as bf16x3 runs
// bfloat16 operands (three products, in_channels tripled by the caller) with a float32
// activation; float32 as TF32 runs float16 operands scaled by powers of two by the
// caller (tf32_scaling.h), descaled in the epilogue, with a float32 activation.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/plan/math_mode.h"
#include "cutlassfuse/plan/problem.h"
#include "cutlassfuse/plan/subpixel.h"
#include "cutlassfuse/sm90/dgrad_config.h"

namespace cutlassfuse::sm90 {

// How the ping-pong kernel schedules a call's tiles (the call's BackendFlags, settings.h).
struct ScheduleOptions {
  // Tiles skip the K blocks of depth taps that read outside the input for all of their
  // pixels (tap_window.h), in the phases whose tiles skip more than one block on average.
  bool skip_border_taps = true;
  // CTAs (clusters of one) draw their units from a counter as they reach them
  // (unit_schedule.cuh) where units are uneven, rather than walking a static list.
  bool drawn_tile_schedule = true;

  bool operator==(const ScheduleOptions&) const = default;
};

// Whether the ping-pong kernel's tiles of `phase` skip border taps under `schedule`:
// the rule its launch applies (tap_window.h), for the plan to report.
bool phase_skips_border_taps(const Problem& problem, const PhaseProblem& phase, const ScheduleOptions& schedule);

// A ping-pong launch's count of the units its CTAs drew (unit_schedule.cuh): in the
// call's workspace, one per launch, and it needs no zeroing before the launch.
struct UnitCounter {
  uint64_t epoch;
  int drawn;
};

// A call's unit counters: one per phase, the most a call has (kMaxPartialsRegions), so
// that every launch of a call (phase streams run them at once) has its own.
inline int64_t unit_counters_bytes() { return kMaxPartialsRegions * static_cast<int64_t>(sizeof(UnitCounter)); }

// Whole tensors; a phase's views (offsets, strides) apply inside.
struct DgradOperands {
  const void* input;               // [N, D, H, W, Cin] (NDHWC, packed)
  const void* filter;              // [Cin, T, R, S, Cout]: PyTorch's (Cin, Cout, T, R, S) permuted
  const void* bias;                // [Cout], or nullptr for no bias
  void* activation;                // [N, Do, Ho, Wo, Cout] (NDHWC, packed)
  WelfordPartial* partials;        // the phase's region (PartialsRegion): TilePartials::slots(...) entries
  int* finish_counters = nullptr;  // group_norm_finish_counters(batch), zeroed by the epilogue's first tile
  // The counter of the launch that starts with this phase (a launch per phase stream,
  // per kMaxPhasesPerLaunch phases); nullptr: every CTA walks its units statically.
  UnitCounter* unit_counter = nullptr;
  // The factor the epilogue multiplies the accumulators by before the bias, on the
  // device: the math modes that scale their operands (scales_operands), else unused.
  const float* descale = nullptr;

  bool operator==(const DgradOperands&) const = default;
};

// The GroupNorm view of one phase: its pixels per sample are the rows of its tiles.
inline GroupNormShape phase_group_norm_shape(const Problem& problem, const PhaseProblem& phase) {
  return {problem.batch, problem.out_channels, phase.output_spatial(), problem.num_groups};
}

// Empty when the kernel can run `phase` of `problem`, else why not. Checks this
// kernel's rules and CUTLASS's can_implement.
template <MathMode M>
std::string dgrad_unsupported_reason(DgradConfig config, const Problem& problem, const PhaseProblem& phase);

// The pixel-shuffle GEMM (subpixel.h) of `gemm` (its 1x1x1 problem) on an NCDHW input
// read as it is: batched over the samples, each sample's channels planes of its pixels
// (PixelMajorGemmKernel, dgrad.cu); 128x128 tiles on the ping-pong kernel
// with the same epilogue. `operands.input` is the NCDHW input. The statistics number
// each sample's rows padded to whole tiles (no tile holds two samples): the partials
// layout is TilePartials of a GroupNormShape with spatial = pixel_major_statistics_rows().
inline constexpr TileExtent kPixelMajorGemmTile{128, 128};
inline int64_t pixel_major_statistics_rows(int64_t pixels) {
  return ceil_div(pixels, kPixelMajorGemmTile.m) * kPixelMajorGemmTile.m;
}
template <MathMode M>
std::string pixel_major_gemm_unsupported_reason(const Problem& gemm);
template <MathMode M>
void pixel_major_gemm_fused(const Problem& gemm, const DgradOperands& operands, int sm_count, cudaStream_t stream);

struct PhaseLaunch {
  const PhaseProblem* phase;
  DgradOperands operands;
};

// Launches the phases on `stream`: up to 8 phases per launch of the ping-pong kernel
// (scheduled as `schedule` says). Throws std::runtime_error if CUTLASS refuses or a
// launch fails.
template <MathMode M>
void dgrad_fused(DgradConfig config, const Problem& problem, std::span<const PhaseLaunch> phases,
                 const ScheduleOptions& schedule, int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse::sm90

namespace cutlassfuse::sm90 {

// The ping-pong kernel with 128x128 tiles in `config`'s cluster and CUTLASS's stock
// epilogue: a plain store of the convolution, no bias, ReLU or statistics. The baseline
// the fused epilogue is measured against (benchmarks), not a path of the op. Operands'
// bias and partials are unused.
template <MathMode M>
void dgrad_plain(DgradConfig config, const Problem& problem, std::span<const PhaseLaunch> phases,
                 const ScheduleOptions& schedule, int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse::sm90
