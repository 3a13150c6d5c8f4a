// The host's view of the ping-pong kernel's border-tap rule (tap_window.h), so that a
// call's plan can report whether its tiles skip taps.
#include "cutlassfuse/sm90/dgrad_launch.cuh"

namespace cutlassfuse::sm90 {

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
