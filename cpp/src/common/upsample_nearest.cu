// Nearest upsampling of packed 5-D tensors. See cutlassfuse/common/upsample_nearest.h.
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>

#include "common/gather_copy.cuh"
#include "common/nearest_grid.cuh"
#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/upsample_nearest.h"

namespace cutlassfuse {
namespace {

constexpr const char* kOp = "upsample_nearest3d";

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
