// float32 on bfloat16 tensor cores (float32 mode "bf16x3", settings.h): each
// float32 value v is split into bfloat16 pieces, v0 = bf16(v), v1 = bf16(v - v0), and
// x * w ~ x0 w0 + x0 w1 + x1 w0 (the dropped x1 w1 is ~2^-18 relative; bfloat16 has
// float32's exponent range, so nothing overflows or flushes as a float16 split would).
// The products run as ONE GEMM over kProducts times the input channels: input channel
// block b holds piece input_piece(b) of x, filter block b piece filter_piece(b) of w.
//
// Three products, not six of a three-piece split: the tensor cores' float32
// accumulation, not the split, bounds the accuracy (docs/performance.md).
#pragma once

#include "cutlassfuse/common/host_device.h"

namespace cutlassfuse::float32_split {

constexpr int kPieces = 2;
constexpr int kProducts = 3;

// Functions rather than arrays, so that device code can use them too.
CUTLASSFUSE_HOST_DEVICE constexpr int input_piece(int block) {
  constexpr int kInputPiece[kProducts] = {0, 0, 1};
  return kInputPiece[block];
}

CUTLASSFUSE_HOST_DEVICE constexpr int filter_piece(int block) {
  constexpr int kFilterPiece[kProducts] = {0, 1, 0};
  return kFilterPiece[block];
}

}  // namespace cutlassfuse::float32_split
