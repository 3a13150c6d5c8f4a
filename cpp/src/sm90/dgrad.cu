// The sm90 fused dgrad family (sm90/dgrad.h) in its four math modes, every tile
// configuration of each, and the host's view of the ping-pong kernel's border-tap rule.
//
// One translation unit for the twelve kernels: they differ in element types and tile
// shapes only, so most of the template instantiations that make up cicc's time are
// common to them, and one compile makes them once (docs/architecture.md, "The build").
#include "cutlassfuse/sm90/dgrad_launch.cuh"

// float16 and bfloat16 calls: operands and activation in the call's dtype.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat16, cutlass::half_t, cutlass::half_t)
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kBFloat16, cutlass::bfloat16_t, cutlass::bfloat16_t)
// float32 calls at TF32's precision: float16 operands holding the input and filter
// scaled by powers of two and rounded to nearest (common/tf32_scaling.h), float32
// accumulation, descaled in the epilogue, a float32 activation.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsTf32, cutlass::half_t, float)
// float32 calls: bfloat16 operands holding the input and filter split into pieces (three
// products; float32_split.h), float32 accumulation, a float32 activation.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsBf16x3, cutlass::bfloat16_t, float)

namespace cutlassfuse::sm90 {

// Whether a phase's tiles skip depth taps (tap_window.h), as the ping-pong kernel decides
// it, so that a call's plan can report it.
bool phase_skips_border_taps(const Problem& problem, const PhaseProblem& phase, const ScheduleOptions& schedule) {
  if (!schedule.skip_border_taps) return false;
  // K blocks of 64 channels at each filter tap, as the kernels' TileShape tiles K.
  constexpr int kTileK = 64;
  constexpr int kTileM = 128;
  const Extent3& taps = phase.filter.extent;
  const auto k_tiles = static_cast<int>(ceil_div(problem.in_channels, kTileK) * taps[0] * taps[1] * taps[2]);
  const TapWindow window =
      GemmExtents<DgradShape>::taps(make_problem_shape(problem, phase), k_tiles, kTileM, /*skip_border_taps=*/true);
  return !window.every_tap;
}

}  // namespace cutlassfuse::sm90
