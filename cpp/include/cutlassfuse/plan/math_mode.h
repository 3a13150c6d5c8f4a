// What a tensor-core path multiplies, apart from what the tensors hold: a float32 call
// stores float32 but may multiply bfloat16 pieces (or, on a future path, TF32).
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
};

// The math of a tensor-core call in `element`, or nothing where the float32 mode asks
// for PyTorch's own convolution (settings.h).
constexpr std::optional<MathMode> tensor_core_math(ElementType element, Float32Mode float32) {
  switch (element) {
    case ElementType::kFloat16: return MathMode::kFloat16;
    case ElementType::kBFloat16: return MathMode::kBFloat16;
    default: return float32 == Float32Mode::kBf16x3 ? std::optional(MathMode::kFloat32AsBf16x3) : std::nullopt;
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
    default: return f(std::integral_constant<MathMode, MathMode::kFloat16>{});
  }
}

}  // namespace cutlassfuse
