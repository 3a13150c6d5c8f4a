// The sm90 fused dgrad family's tile configurations and the heuristic choosing one.
// Plain C++: the process settings (settings.h) name them in every build.
#pragma once

#include <optional>
#include <string_view>

#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse::sm90 {

// CTA tile (M pixels x N channels, K = 64) and cluster of the persistent ping-pong
// kernel (dgrad_pingpong.cuh: up to 8 phases per launch, epilogues overlapped with
// MMAs): clusters of 1 or 2 CTAs along M (the pair's filter tile loaded once, multicast
// to both). Only those the heuristic chooses: each math mode's TU compiles every one.
enum class DgradConfig { k128x128_pingpong, k128x64_pingpong, k128x128_pingpong_cluster2x1 };
inline constexpr DgradConfig kDgradConfigs[] = {DgradConfig::k128x128_pingpong, DgradConfig::k128x64_pingpong,
                                                DgradConfig::k128x128_pingpong_cluster2x1};

// Phases one ping-pong launch takes (3-D stride 2 has 8); the kernel's parameters hold
// each phase's TMA descriptors and epilogue arguments.
inline constexpr int kMaxPhasesPerLaunch = 8;

struct TileExtent {
  int m;
  int n;
};
TileExtent tile_extent(DgradConfig config);
const char* config_name(DgradConfig config);
std::optional<DgradConfig> config_from_name(std::string_view name);
int cluster_size(DgradConfig config);

// The heuristic's configuration for `problem` (the GEMM the kernels run).
DgradConfig choose_config(const Problem& problem);

}  // namespace cutlassfuse::sm90
