// Nearest upsampling of packed 5-D tensors. See cutlassfuse/common/upsample_nearest.h.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "common/gather_copy.cuh"
#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/upsample_nearest.h"

namespace cutlassfuse {
namespace {

constexpr const char* kOp = "upsample_nearest3d";

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

}  // namespace

float upsample_nearest_scale(double scale_factor, bool given, int64_t input, int64_t output) {
  return given && scale_factor > 0. ? static_cast<float>(1.0 / scale_factor)
                                    : static_cast<float>(input) / static_cast<float>(output);
}

bool upsample_nearest3d_takes(const UpsampleNearest3d& p, int64_t element_bytes) {
  // 32-bit indices, and loops whose index stays below 2^32 as it strides past the end.
  constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8 && element_bytes != 16)
    return false;
  if (p.batch < 1 || p.channels < 1) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (p.input[dim] < 1 || p.output[dim] < 1 || !std::isfinite(p.scale[dim]) || p.scale[dim] < 0.f) return false;
  }
  // Causal frames: the first frame alone, or the first and later ones on both sides.
  if (p.causal_frames && (p.input[0] == 1) != (p.output[0] == 1)) return false;
  return p.input_elements() <= kMaxElements && p.output_elements() <= kMaxElements;
}

void upsample_nearest3d(const void* src, void* dst, int64_t element_bytes, bool channels_last,
                        const UpsampleNearest3d& p, cudaStream_t stream) {
  if (!upsample_nearest3d_takes(p, element_bytes))
    throw std::invalid_argument(
        "cutlassfuse: upsample_nearest3d takes non-empty tensors of up to 2^31 - 1 elements and finite scales");
  if (channels_last) {
    gather_copy::launch_channels_last_gather(src, dst, NearestGrid(p), p.output_elements() / p.channels,
                                             p.channels * element_bytes, element_bytes, kOp, stream);
  } else {
    gather_copy::with_bytes(element_bytes, kOp, [&](auto bytes) {
      gather_copy::launch_channels_first_gather<NearestGrid, decltype(bytes)::value>(src, dst, NearestGrid(p),
                                                                                     p.output_elements(), stream);
    });
  }
}

}  // namespace cutlassfuse
