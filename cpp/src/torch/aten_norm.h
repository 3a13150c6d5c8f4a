// Pieces of the references' ATen GroupNorm calls (reference.cpp, block_reference.cpp,
// block_backward_registration.cpp).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>

namespace cutlassfuse {

// ATen's CUDA GroupNorm reads gamma and beta as the input's type; the ops take them in
// any floating type (float32 ones with a float16 input under autocast).
inline std::optional<at::Tensor> as_type(const std::optional<at::Tensor>& t, at::ScalarType type) {
  return t.has_value() && t->defined() ? std::optional<at::Tensor>(t->to(type)) : std::nullopt;
}

// A per-channel vector in `like`'s dtype, shaped to broadcast over a 5-D tensor.
inline at::Tensor per_channel(const at::Tensor& v, const at::Tensor& like) {
  return v.to(like.scalar_type()).view({1, -1, 1, 1, 1});
}

// (batch, channels, pixels per sample) of a 5-D tensor.
inline std::array<int64_t, 3> group_norm_extents(const at::Tensor& y) {
  const int64_t n = y.size(0), c = y.size(1);
  return {n, c, n * c > 0 ? y.numel() / (n * c) : 0};
}

// The layout at::native_group_norm takes: the CPU kernel reads either format, the CUDA
// one only the contiguous one.
inline at::MemoryFormat group_norm_input_format(const at::Tensor& y) {
  return y.is_cpu() ? y.suggest_memory_format() : at::MemoryFormat::Contiguous;
}

}  // namespace cutlassfuse
