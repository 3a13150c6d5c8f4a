// Tile configurations of the sm90 fused dgrad family and the heuristic choosing one.
#include <atomic>

#include "cutlassfuse/dgrad_sm90.h"

namespace cutlassfuse::sm90 {
namespace {

// -1: no override. Set through torch.ops.cutlassfuse.set_dgrad_config for benchmarks.
std::atomic<int> g_override{-1};
std::atomic<bool> g_skip_border_taps{true};
std::atomic<bool> g_drawn_tile_schedule{true};

}  // namespace

TileExtent tile_extent(DgradConfig config) {
  const bool narrow = config == DgradConfig::k128x64_cluster1x1 || config == DgradConfig::k128x64_pingpong;
  return narrow ? TileExtent{128, 64} : TileExtent{128, 128};
}

const char* config_name(DgradConfig config) {
  switch (config) {
    case DgradConfig::k128x64_cluster1x1: return "128x64_cluster1x1";
    case DgradConfig::k128x128_pingpong: return "128x128_pingpong";
    case DgradConfig::k128x64_pingpong: return "128x64_pingpong";
    case DgradConfig::k128x128_pingpong_cluster2x1: return "128x128_pingpong_cluster2x1";
    default: return "128x128_cluster1x1";
  }
}

std::optional<DgradConfig> config_from_name(std::string_view name) {
  for (DgradConfig config : kDgradConfigs) {
    if (name == config_name(config)) return config;
  }
  return std::nullopt;
}

void set_config_override(std::optional<DgradConfig> config) {
  g_override.store(config ? static_cast<int>(*config) : -1);
}

std::optional<DgradConfig> config_override() {
  const int pinned = g_override.load();
  return pinned >= 0 ? std::optional(static_cast<DgradConfig>(pinned)) : std::nullopt;
}

void set_skip_border_taps(bool enabled) { g_skip_border_taps.store(enabled); }

bool skip_border_taps() { return g_skip_border_taps.load(); }

void set_drawn_tile_schedule(bool enabled) { g_drawn_tile_schedule.store(enabled); }

bool drawn_tile_schedule() { return g_drawn_tile_schedule.load(); }

DgradConfig choose_config(const Problem& problem) {
  if (const auto pinned = config_override()) return *pinned;
  // The ping-pong kernel hides each tile's epilogue behind the other consumer's MMAs
  // and runs all sub-pixel phases in one launch. A 128-channel tile would compute half
  // zeros for 64 or fewer output channels.
  if (problem.out_channels <= 64) return DgradConfig::k128x64_pingpong;
  // Stride-1 layers: clusters of one, whose CTAs draw their tiles (unit_schedule.cuh),
  // which the border planes' lighter tiles make uneven: faster than pairs of CTAs sharing
  // the filter tile on every measured stride-1 layer but one (benchmarks/variant_choice.py
  // clusters; docs/performance.md). Sub-pixel phases beyond one N tile keep the pairs,
  // faster there than clusters of one.
  const bool stride_one = problem.stride[0] == 1 && problem.stride[1] == 1 && problem.stride[2] == 1;
  if (!stride_one && problem.out_channels > 128) return DgradConfig::k128x128_pingpong_cluster2x1;
  return DgradConfig::k128x128_pingpong;
}

}  // namespace cutlassfuse::sm90
