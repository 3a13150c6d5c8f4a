// Where the pixel-shuffle GEMM's space-to-depth activation (norm/group_norm.h,
// PixelShuffle) holds each output pixel: read by the forward's normalize and by the
// ReLU op's backward.
#pragma once

#include <cstdint>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse {

// Where output pixel (od, oh, ow) of a sample is in the space-to-depth activation:
// input pixel (od / bd, oh / bh, ow / bw), block position (od % bd, oh % bh, ow % bw).
// Pixels within a sample stay below 2^31 on the fused path (it takes fewer than 2^31
// output elements), so the divisions are 32-bit multiply-highs.
struct ShuffleIndex {
  FastDivisor out_w, out_h, block_d, block_h, block_w;
  uint32_t in_h = 1, in_w = 1, block_h_size = 1, block_w_size = 1, block_volume = 1;

  ShuffleIndex() = default;
  explicit ShuffleIndex(const PixelShuffle& order)
      : out_w(order.output_size[2]), out_h(order.output_size[1]), block_d(order.block[0]), block_h(order.block[1]),
        block_w(order.block[2]), in_h(order.output_size[1] / order.block[1]),
        in_w(order.output_size[2] / order.block[2]), block_h_size(order.block[1]), block_w_size(order.block[2]),
        block_volume(order.block[0] * order.block[1] * order.block[2]) {}

  __device__ __forceinline__ int64_t source_row(int64_t pixel) const {
    const uint32_t p = static_cast<uint32_t>(pixel);
    const uint32_t dh = out_w.quotient(p), ow = out_w.remainder(p, dh);
    const uint32_t od = out_h.quotient(dh), oh = out_h.remainder(dh, od);
    const uint32_t id = block_d.quotient(od), ih = block_h.quotient(oh), iw = block_w.quotient(ow);
    const uint32_t position = (block_d.remainder(od, id) * block_h_size + block_h.remainder(oh, ih)) * block_w_size +
                              block_w.remainder(ow, iw);
    return (int64_t{(id * in_h + ih)} * in_w + iw) * block_volume + position;
  }
};

// The activation row (within its sample) of output pixel `pixel`.
template <bool kShuffled>
__device__ __forceinline__ int64_t source_row(int64_t pixel, const ShuffleIndex& order) {
  if constexpr (kShuffled) return order.source_row(pixel);
  return pixel;
}

}  // namespace cutlassfuse
