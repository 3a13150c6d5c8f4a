// Tile configurations of the sm90 fused dgrad family and the heuristic choosing one.
#include <atomic>

#include "cutlassfuse/dgrad_sm90.h"

namespace cutlassfuse::sm90 {
namespace {

// -1: no override. Set through torch.ops.cutlassfuse.set_dgrad_config for benchmarks.
std::atomic<int> g_override{-1};
std::atomic<bool> g_skip_border_taps{true};

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

DgradConfig choose_config(const Problem& problem) {
  if (const auto pinned = config_override()) return *pinned;
  // The ping-pong kernel hides each tile's epilogue behind the other consumer's MMAs
  // and runs all sub-pixel phases in one launch. A 128-channel tile would compute half
  // zeros for 64 or fewer output channels.
  if (problem.out_channels <= 64) return DgradConfig::k128x64_pingpong;
  // Pairs of CTAs sharing the filter tile: 0.2-7.6 % faster with two or more N tiles;
  // with one, 0.5-1.9 % faster on kb61 (fp16 and bf16, three sessions' alternating
  // rounds), within noise on a 48^3 stride-1 layer, and 2-3 % slower on small layers
  // (kb61_v0, 51,840 output pixels) and on sub-pixel phases (gan)
  // (benchmarks/variant_choice.py clusters; docs/performance.md, seventeenth session).
  constexpr int64_t kLargeLayerPixels = int64_t{1} << 16;
  const bool stride_one = problem.stride[0] == 1 && problem.stride[1] == 1 && problem.stride[2] == 1;
  if (problem.out_channels > 128 || (stride_one && problem.batch * problem.output_spatial() >= kLargeLayerPixels))
    return DgradConfig::k128x128_pingpong_cluster2x1;
  return DgradConfig::k128x128_pingpong;
}

}  // namespace cutlassfuse::sm90
