// Nearest upsampling's index map (PyTorch's, aten::upsample_nearest3d; the causal frames of
// video autoencoders as cutlassfuse/common/upsample_nearest.h describes them) as a
// gather_copy Map: the nearest upsampling's copy and the upsampled modulation read their
// sources through it.
#pragma once

#include <cstdint>

#include "common/gather_copy.cuh"
#include "cutlassfuse/common/upsample_nearest.h"

namespace cutlassfuse {

// ATen's source index (nearest_neighbor_compute_source_index): the float product floored,
// clamped to the last index.
__device__ __forceinline__ uint32_t nearest_source(uint32_t index, float scale, uint32_t extent) {
  return min(static_cast<uint32_t>(floorf(static_cast<float>(index) * scale)), extent - 1);
}

// The upsampling as a gather_copy Map. 32-bit: upsample_nearest3d_takes bounds both
// tensors' elements.
struct NearestGrid : gather_copy::Extents {
  float scale_d, scale_h, scale_w;
  bool causal_frames;

  explicit NearestGrid(const UpsampleNearest3d& p)
      : Extents(p.input, p.output), scale_d(p.scale[0]), scale_h(p.scale[1]), scale_w(p.scale[2]),
        causal_frames(p.causal_frames) {}

  __device__ __forceinline__ uint32_t source_frame(uint32_t d) const {
    if (!causal_frames) return nearest_source(d, scale_d, in_d);
    return d == 0 ? 0 : 1 + nearest_source(d - 1, scale_d, in_d - 1);
  }

  __device__ __forceinline__ uint32_t source_row(uint32_t row) const {
    const auto [plane, d, h] = row_coordinates(row);
    return (plane * in_d + source_frame(d)) * in_h + nearest_source(h, scale_h, in_h);
  }

  __device__ __forceinline__ uint32_t source_w(uint32_t w) const { return nearest_source(w, scale_w, in_w); }
};

}  // namespace cutlassfuse
