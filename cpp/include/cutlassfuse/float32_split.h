// float32 on bfloat16 tensor cores (opt-in, cutlassfuse.set_float32_tensor_cores): each
// float32 value v is split into bfloat16 pieces, v0 = bf16(v), v1 = bf16(v - v0), and
// x * w ~ x0 w0 + x0 w1 + x1 w0 (the dropped x1 w1 is ~2^-18 relative; bfloat16 has
// float32's exponent range, so nothing overflows or flushes as a float16 split would).
// The products run as ONE GEMM over kProducts times the input channels: input channel
// block b holds piece input_piece(b) of x, filter block b piece filter_piece(b) of w.
//
// What bounds the accuracy is the tensor cores' float32 accumulation, not the split
// (measured on an H100, docs/performance.md): three products land 1e-4 to 4e-4 max abs
// from float64 after GroupNorm, and a three-piece split with six products (2^-26
// relative dropped) landed no closer, 1e-4 to 7e-4, at twice the work: the error grows
// with the GEMM's K, as from a truncating accumulator, not with what the split drops.
// Strict fp32 cuDNN (the default for float32) stays within 1e-4.
#pragma once

namespace cutlassfuse::float32_split {

constexpr int kPieces = 2;
constexpr int kProducts = 3;

// Functions rather than arrays, so that device code can use them too.
#ifdef __CUDACC__
#define CUTLASSFUSE_SPLIT_HOST_DEVICE __host__ __device__
#else
#define CUTLASSFUSE_SPLIT_HOST_DEVICE
#endif

CUTLASSFUSE_SPLIT_HOST_DEVICE constexpr int input_piece(int block) {
  constexpr int kInputPiece[kProducts] = {0, 0, 1};
  return kInputPiece[block];
}

CUTLASSFUSE_SPLIT_HOST_DEVICE constexpr int filter_piece(int block) {
  constexpr int kFilterPiece[kProducts] = {0, 1, 0};
  return kFilterPiece[block];
}

}  // namespace cutlassfuse::float32_split

#undef CUTLASSFUSE_SPLIT_HOST_DEVICE
