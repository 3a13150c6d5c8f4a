// What a tensor-core path multiplies, apart from what the tensors hold: a float32 call
// stores float32 but multiplies its operands rounded to TF32's precision, or bfloat16
// pieces.
#pragma once

#include <optional>
#include <type_traits>

#include "cutlassfuse/plan/float32_split.h"
#include "cutlassfuse/plan/problem.h"
#include "cutlassfuse/settings.h"

namespace cutlassfuse {

enum class MathMode {
  kFloat16,   // float16 operands, float32 accumulation
  kBFloat16,  // bfloat16 operands, float32 accumulation
  // float32 operands split into bfloat16 pieces, three products in one GEMM over three
  // times the input channels (float32_split.h)
  kFloat32AsBf16x3,
  // float32 operands rounded to nearest with TF32's precision (11-bit significands),
  // float32 accumulation, on float16 tensor cores: float16 has TF32's significand but
  // not its exponent range, so each operand tensor is first scaled by a power of two
  // that puts its largest finite magnitude in [2^14, 2^15) (common/tf32_scaling.h), and
  // the epilogue multiplies the accumulators back (scales_operands). The products are
  // TF32's for every operand within 2^28 of its tensor's largest magnitude.
  kFloat32AsTf32,
};

constexpr bool is_16_bit(MathMode math) { return math == MathMode::kFloat16 || math == MathMode::kBFloat16; }

// Whether the operands are scaled by powers of two before the tensor cores multiply
// them, and the epilogue descales the accumulators (tf32_scaling.h).
constexpr bool scales_operands(MathMode math) { return math == MathMode::kFloat32AsTf32; }

// The math of a tensor-core call in `element`, or nothing where the float32 mode asks
// for PyTorch's own convolution (settings.h).
constexpr std::optional<MathMode> tensor_core_math(ElementType element, Float32Mode float32) {
  switch (element) {
    case ElementType::kFloat16: return MathMode::kFloat16;
    case ElementType::kBFloat16: return MathMode::kBFloat16;
    default:
      switch (float32) {
        case Float32Mode::kTf32: return MathMode::kFloat32AsTf32;
        case Float32Mode::kBf16x3: return MathMode::kFloat32AsBf16x3;
        default: return std::nullopt;
      }
  }
}

// The type the activation (and the bias the epilogue reads) is stored in.
constexpr ElementType activation_element(MathMode math) {
  switch (math) {
    case MathMode::kFloat16: return ElementType::kFloat16;
    case MathMode::kBFloat16: return ElementType::kBFloat16;
    default: return ElementType::kFloat32;
  }
}

// Input channels of the GEMM the tensor cores run: the pieces' products side by side.
constexpr int64_t gemm_in_channels(MathMode math, int64_t in_channels) {
  return math == MathMode::kFloat32AsBf16x3 ? in_channels * float32_split::kProducts : in_channels;
}

// Calls f with the math mode as a compile-time constant.
template <class F>
decltype(auto) with_math(MathMode math, F&& f) {
  switch (math) {
    case MathMode::kBFloat16: return f(std::integral_constant<MathMode, MathMode::kBFloat16>{});
    case MathMode::kFloat32AsBf16x3: return f(std::integral_constant<MathMode, MathMode::kFloat32AsBf16x3>{});
    case MathMode::kFloat32AsTf32: return f(std::integral_constant<MathMode, MathMode::kFloat32AsTf32>{});
    default: return f(std::integral_constant<MathMode, MathMode::kFloat16>{});
  }
}

}  // namespace cutlassfuse
