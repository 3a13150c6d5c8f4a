// Host interface of cutlassfuse's GroupNorm kernels over a post-ReLU activation
// stored NDHWC ([batch, spatial, channels], channels fastest).
//
// Statistics arrive as Welford partials (count, mean, M2), each at a fixed position of
// a workspace, so the result is bitwise reproducible (no atomics). They come from one
// of two producers, described by a layout:
//   - TilePartials: the deconvolution's epilogue, one partial per (CTA tile, sample
//     segment of the tile, group segment of the tile);
//   - ChunkPartials: group_norm_partial_stats, one per (sample, chunk of spatial rows,
//     group), for activations that another kernel produced.
// group_norm_apply merges each (sample, group)'s partials in a fixed order with Chan
// et al.'s pairwise update (robust where E[x^2] - E[x]^2 cancels), then writes
// (x - mean) * rstd * gamma + beta, channels-last (in place allowed) or NCDHW.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/problem.h"

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

// Partials of group_norm_partial_stats: slot [sample][chunk][group].
struct ChunkPartials {
  int64_t num_chunks;

  // Enough chunks to fill `sm_count` SMs a few times over.
  static ChunkPartials for_device(const GroupNormShape& shape, int sm_count);
  int64_t slots(const GroupNormShape& shape) const;
};

// Empty when the kernels take `shape`, else why not.
const char* group_norm_unsupported_reason(const GroupNormShape& shape);

void group_norm_partial_stats(ElementType element, const void* activation, const GroupNormShape& shape,
                              ChunkPartials layout, WelfordPartial* partials, cudaStream_t stream);

template <class Partials>
void group_norm_apply(ElementType element, const void* activation, const WelfordPartial* partials, Partials layout,
                      const GroupNormShape& shape, const GroupNormAffine& affine, float eps,
                      bool channels_last_output, void* output, int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse
