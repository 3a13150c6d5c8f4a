// Host interface of cutlassfuse's GroupNorm kernels over a post-ReLU activation
// stored NDHWC ([batch, spatial, channels], channels fastest).
//
// Statistics arrive as partials (count, mean, M2), one per (launch, tile, sample
// segment of the tile, group segment of the tile), each at a fixed position of a
// workspace (StatisticsSources), so results are bitwise reproducible (no atomics):
// from a convolution's epilogue on the fused paths, from norm_activation_stats on
// the fallback (group_norm_generic.h).
//   1. the finalize merges each (sample, group)'s partials once, in a fixed order,
//      with Chan et al.'s pairwise update (robust where E[x^2] - E[x]^2 cancels) into
//      mean and rstd, folded with gamma and beta into a per-channel scale and shift;
//   2. the normalize writes x * scale + shift, channels-last (in place allowed) or
//      NCDHW through an on-chip transpose.
// The fused deconvolution's path runs both in one launch (group_norm_finish): its first
// blocks finalize, the others normalize a sample once its groups are finalized. Merging
// in every normalize block instead re-reads the partials thousands of times and measured
// slower than a separate finalize launch. The fused forward convolution and the
// fallback run group_norm_finalize, then their normalize (group_norm_generic.h).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/common/host_device.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

struct WelfordPartial {
  float count;
  float mean;
  float m2;  // sum of squared deviations from `mean`
};

struct GroupNormShape {
  int64_t batch;
  int64_t channels;
  int64_t spatial;  // Do * Ho * Wo
  int64_t num_groups;
};

// The order in which the activation holds a sample's output pixels: NDHWC (block
// 1x1x1), or space-to-depth, as the pixel-shuffle GEMM computes it (kernel == stride):
// input pixel z holds the block_d x block_h x block_w output pixels it produces,
// block position major, each a row of `channels`.
struct PixelShuffle {
  int block[3] = {1, 1, 1};
  int output_size[3] = {1, 1, 1};  // Do, Ho, Wo

  bool identity() const { return block[0] * block[1] * block[2] == 1; }
};

struct GroupNormAffine {
  const void* gamma;  // [channels] or nullptr (ones)
  const void* beta;   // [channels] or nullptr (zeros)
  ElementType element;
};

// Partials of CTA tiles of tile_m output pixels x tile_n channels. A tile covers the
// rows of up to max_segments samples and the channels of up to max_local_groups
// groups; slot [tile row][sample segment][tile column][group segment].
struct TilePartials {
  int tile_m;
  int tile_n;
  int tiles_n;
  int max_segments;
  int max_local_groups;

  static TilePartials for_tiles(const GroupNormShape& shape, int tile_m, int tile_n);
  int64_t slots(const GroupNormShape& shape) const;
};

// The slot of tile (tile_row, tile_col)'s partial of its segment-th sample and its
// local_group-th group, counted from its region's first slot (the epilogue node keeps
// TilePartials' counts as separate parameters, hence the unpacked form).
CUTLASSFUSE_HOST_DEVICE int64_t tile_partial_slot(int64_t tile_row, int64_t segment, int64_t tile_col,
                                                  int64_t local_group, int64_t max_segments, int64_t tiles_n,
                                                  int64_t max_local_groups) {
  return ((tile_row * max_segments + segment) * tiles_n + tile_col) * max_local_groups + local_group;
}

// The partials of one deconvolution launch (one sub-pixel phase), which computes
// `spatial` output pixels per sample, from slot first_slot of the workspace on.
// group_offset: the launch's column group that holds GroupNorm group 0 (nonzero when
// one launch computes several blocks of channels, see PixelShuffle).
struct PartialsRegion {
  TilePartials tiles;
  int64_t spatial;
  int64_t first_slot;
  int group_offset = 0;
};

// Sub-pixel phases of a stride-4 deconvolution in all three dimensions.
inline constexpr int kMaxPartialsRegions = 64;

// What the statistics of a (sample, group) merge: every region's partials, in region
// order, then the output pixels no input reaches, which hold ReLU(bias) per channel
// (closed-form moments; see subpixel.h). kCapacity: the regions it holds. The finalize
// reads it as a kernel parameter, which every launch copies: the sub-pixel phases' 64
// regions make 3 KB, a single convolution's or statistics pass's one region 48 bytes.
template <int kCapacity>
struct StatisticsSourcesOf {
  PartialsRegion regions[kCapacity];
  int region_count = 0;
  int64_t unreached_pixels = 0;  // per sample
  const void* bias = nullptr;    // [channels], the activation's element type; nullptr: no bias
};
using StatisticsSources = StatisticsSourcesOf<kMaxPartialsRegions>;  // a deconvolution's sub-pixel phases
using SingleRegionSources = StatisticsSourcesOf<1>;                  // one launch's tiles

// Empty when the kernels take `shape`, else why not.
const char* group_norm_unsupported_reason(const GroupNormShape& shape);

// Bytes of the per-(sample, channel) scale and shift (float2) group_norm_finalize writes.
int64_t group_norm_scale_shift_bytes(const GroupNormShape& shape);

// What the finalize reads and writes: the arguments of group_norm_finalize, and of the
// kernels whose first blocks finalize.
template <int kCapacity>
struct StatisticsFinalizeOf {
  const WelfordPartial* partials = nullptr;
  StatisticsSourcesOf<kCapacity> sources;
  ElementType element = ElementType::kFloat16;  // the activation's, which the bias in `sources` shares
  int64_t batch = 0;
  int channels = 0;
  int num_groups = 0;
  GroupNormAffine affine{};
  float eps = 0.f;
  float2* scale_shift = nullptr;  // [batch, channels]: (scale, shift)
  // [batch, num_groups] each, written when not null: what a backward needs.
  float* mean = nullptr;
  float* rstd = nullptr;
  // [channels] of `element`, or nullptr: a per-channel constant the partials' values lack
  // (the bias of a convolution output kept without it), added to the mean. Only for one
  // channel per group, where adding a constant moves the mean and leaves the variance.
  const void* mean_shift = nullptr;
};
using StatisticsFinalize = StatisticsFinalizeOf<kMaxPartialsRegions>;
using SingleRegionFinalize = StatisticsFinalizeOf<1>;

// `element`: the activation's type, which the bias in `sources` shares.
template <int kCapacity>
StatisticsFinalizeOf<kCapacity> statistics_finalize(const WelfordPartial* partials,
                                                    const StatisticsSourcesOf<kCapacity>& sources, ElementType element,
                                                    const GroupNormShape& shape, const GroupNormAffine& affine,
                                                    float eps, void* scale_shift) {
  return {partials,
          sources,
          element,
          shape.batch,
          static_cast<int>(shape.channels),
          static_cast<int>(shape.num_groups),
          affine,
          eps,
          static_cast<float2*>(scale_shift)};
}

// Any channel count; batch <= 65535. Partials of one launch's tiles (one region).
void group_norm_finalize(const SingleRegionFinalize& finalize, cudaStream_t stream);

// group_norm_finish's counts of finalized groups, one int per sample, zero when it
// starts: the deconvolution's first epilogue tile zeroes them (the kernel before it in
// the stream), so a call needs no memset.
inline int64_t group_norm_finish_counters(int64_t batch) { return batch; }

// The fused path's finishing kernel (the register path; NCDHW output of 16-bit
// activations may take sm90's bulk-copy one): finalizes `finalize` and normalizes the
// activation of `spatial` pixels per sample, in `order` (NDHWC or space-to-depth), into
// `output` (channels-last or NCDHW), the finalize's scale_shift holding the
// per-channel scale and shift in between. In place only for NDHWC to channels-last;
// group_norm_unsupported_reason() empty. A space-to-depth activation that a backward
// reads is also written in pixel order, NDHWC, to `activation_in_pixel_order` (else
// nullptr) as the normalize reads it: the backward's layout without a pass of its own.
void group_norm_finish(const StatisticsFinalize& finalize, int* groups_finalized, const void* activation,
                       const PixelShuffle& order, int64_t spatial, bool channels_last_output, void* output,
                       void* activation_in_pixel_order, cudaStream_t stream);

}  // namespace cutlassfuse
