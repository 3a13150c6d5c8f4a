// Process-wide user settings of the op, as torch.backends keeps PyTorch's: atomics read
// once per call, validated here (the Python setters only forward the value).
#pragma once

#include <optional>
#include <string_view>

namespace cutlassfuse {

// How float32 calls compute the convolution.
enum class Float32Mode {
  // As PyTorch runs it under its current switches (TF32 where torch.backends.cudnn's
  // conv switch allows it, strict fp32 otherwise; deterministic and benchmark as set),
  // then this project's bias + ReLU + GroupNorm kernels. The default: the op's float32
  // numerics are those of the modules it replaces.
  kPyTorch,
  // The fused tensor-core path, each float32 operand split into bfloat16 pieces and the
  // products summed in fp32 (float32_split.h): within ~7e-4 of float64 after GroupNorm;
  // faster than PyTorch's TF32 on stride-1 layers, not on every strided one.
  kBf16x3,
};

Float32Mode float32_mode();
void set_float32_mode(Float32Mode mode);
const char* float32_mode_name(Float32Mode mode);
std::optional<Float32Mode> float32_mode_from_name(std::string_view name);
// The names float32_mode_from_name knows, comma-separated (for error messages).
const char* float32_mode_names();

}  // namespace cutlassfuse
