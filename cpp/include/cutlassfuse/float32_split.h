// float32 on bfloat16 tensor cores: each float32 value v is split into three bfloat16
// pieces, v0 = bf16(v), v1 = bf16(v - v0), v2 = bf16(v - v0 - v1), which hold all 24
// bits of its significand (bfloat16 has float32's exponent range, so nothing overflows
// or flushes as a float16 split would). x * w is then the sum of the piece products
// x_i w_j with i + j <= 2; the dropped ones (x1 w2, x2 w1, x2 w2) are ~2^-26 relative,
// below float32's own rounding. The six products run as ONE GEMM over six times the
// input channels: input channel block b holds piece input_piece(b) of x, filter block b
// piece filter_piece(b) of w.
//
// Measured on kb61 (docs/performance.md): three products ([hi, hi, lo] x [hi; lo; hi],
// ~2^-17 relative per product) land 1e-4 to 4e-4 max abs from float64 after GroupNorm,
// above the 1e-4 bar; the six products cost twice as much and land at float32's level.
#pragma once

namespace cutlassfuse::float32_split {

constexpr int kPieces = 3;
constexpr int kProducts = 6;

// Functions rather than arrays, so that device code can use them too.
#ifdef __CUDACC__
__host__ __device__
#endif
constexpr int input_piece(int block) {
  constexpr int kInputPiece[kProducts] = {0, 0, 1, 0, 1, 2};
  return kInputPiece[block];
}

constexpr int filter_piece(int block) {
  constexpr int kFilterPiece[kProducts] = {0, 1, 0, 2, 1, 0};
  return kFilterPiece[block];
}

}  // namespace cutlassfuse::float32_split
