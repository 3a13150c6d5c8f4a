// Tile configurations of the sm90 fused dgrad family and the heuristic choosing one.
#include "cutlassfuse/sm90/dgrad_config.h"

namespace cutlassfuse::sm90 {

TileExtent tile_extent(DgradConfig config) {
  return config == DgradConfig::k128x64_pingpong ? TileExtent{128, 64} : TileExtent{128, 128};
}

const char* config_name(DgradConfig config) {
  switch (config) {
    case DgradConfig::k128x64_pingpong: return "128x64_pingpong";
    case DgradConfig::k128x128_pingpong_cluster2x1: return "128x128_pingpong_cluster2x1";
    default: return "128x128_pingpong";
  }
}

std::optional<DgradConfig> config_from_name(std::string_view name) {
  for (DgradConfig config : kDgradConfigs) {
    if (name == config_name(config)) return config;
  }
  return std::nullopt;
}

int cluster_size(DgradConfig config) { return config == DgradConfig::k128x128_pingpong_cluster2x1 ? 2 : 1; }

DgradConfig choose_config(const Problem& problem) {
  // The ping-pong kernel hides each tile's epilogue behind the other consumer's MMAs
  // and runs all sub-pixel phases in one launch. A 128-channel tile would compute half
  // zeros for 64 or fewer output channels.
  if (problem.out_channels <= 64) return DgradConfig::k128x64_pingpong;
  // Stride-1 layers: clusters of one, whose CTAs draw their tiles (unit_schedule.cuh),
  // which the border planes' lighter tiles make uneven; sub-pixel phases beyond one N
  // tile: pairs of CTAs sharing the filter tile. Each the faster on the layers measured
  // (docs/performance.md).
  const bool stride_one = problem.stride[0] == 1 && problem.stride[1] == 1 && problem.stride[2] == 1;
  if (!stride_one && problem.out_channels > 128) return DgradConfig::k128x128_pingpong_cluster2x1;
  return DgradConfig::k128x128_pingpong;
}

}  // namespace cutlassfuse::sm90
