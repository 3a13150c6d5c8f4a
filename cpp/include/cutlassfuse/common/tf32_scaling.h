// float32 at TF32's precision on float16 tensor cores (MathMode::kFloat32AsTf32).
//
// TF32 keeps float32's 8 exponent bits and 10 of its 23 mantissa bits; float16 has the
// same 10 mantissa bits and 5 exponent bits. A float32 value x scaled by 2^e (exactly)
// and rounded to nearest float16 is x rounded to nearest TF32, times 2^e, wherever
// x * 2^e is a normal float16. So each operand tensor gets the e that puts its largest
// finite magnitude m in [2^14, 2^15) (nothing rounds past float16's largest finite
// value), and every value down to m * 2^-28 keeps TF32's 11 significant bits; smaller
// ones round to float16's subnormal steps, an absolute error of at most m * 2^-39
// (TF32's rounding of m itself may err by m * 2^-11). The scaled operands' products,
// accumulated in float32, are the TF32 operands' times 2^(e_input + e_filter): the
// epilogue multiplies the accumulators by descale = 2^-(e_input + e_filter).
//
// Infinities and NaNs pass through and do not count towards m. The two tensors' e sum
// to at most 126, so that descale stays a normal float32: where their m multiply below
// 2^-98, both e shrink, and their smallest values keep fewer significant bits. descale
// overflows to infinity only where the two m multiply past 2^155, beyond float32's
// range.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/common/host_device.h"

namespace cutlassfuse {

// A call's scaling, in its workspace: the operands' largest finite magnitudes (as the
// bits of a non-negative float32, whose order as integers is the floats'; input then
// filter, adjacent), then the epilogue's factor.
struct Tf32OperandScales {
  uint32_t input_max_bits;
  uint32_t filter_max_bits;
  float descale;
};

// Where a tensor's largest magnitude lands after scaling: [2^kScaledTop, 2^(kScaledTop+1)).
inline constexpr int kScaledTop = 14;
// The most the two exponents may sum to: descale = 2^-126, float32's smallest normal.
inline constexpr int kMaxExponentSum = 126;

struct Tf32ScaleExponents {
  int input;
  int filter;
};

// e for each operand, from the bits of its largest finite magnitude (0 for a tensor of
// zeros and non-finite values only: e = 0). Within [-113, 163] each.
CUTLASSFUSE_HOST_DEVICE constexpr Tf32ScaleExponents tf32_scale_exponents(uint32_t input_max_bits,
                                                                          uint32_t filter_max_bits) {
  auto exponent = [](uint32_t max_bits) {
    const int floor_log2 = static_cast<int>(max_bits >> 23) - 127;  // -127 for a subnormal m
    return max_bits == 0 ? 0 : kScaledTop - floor_log2;
  };
  Tf32ScaleExponents e{exponent(input_max_bits), exponent(filter_max_bits)};
  if (const int excess = e.input + e.filter - kMaxExponentSum; excess > 0) {
    e.input -= (excess + 1) / 2;
    e.filter -= excess / 2;
  }
  return e;
}

// Zeroes `scales` and measures both operands' largest finite magnitudes into it, in
// one launch: `input` and `filter` are float32, dense (any memory format).
void measure_tf32_operands(const void* input, int64_t input_numel, const void* filter, int64_t filter_numel,
                           Tf32OperandScales* scales, cudaStream_t stream);

// dst (float16) = filter (float32) scaled by 2^e_filter, rounded to nearest, element by
// element; writes scales->descale. After measure_tf32_operands on the stream.
void scale_filter_tf32(const void* filter, int64_t numel, Tf32OperandScales* scales, void* dst, cudaStream_t stream);

}  // namespace cutlassfuse
