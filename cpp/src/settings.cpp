#include "cutlassfuse/settings.h"

#include <atomic>

namespace cutlassfuse {
namespace {

std::atomic<Float32Mode> g_float32_mode{Float32Mode::kPyTorch};

}  // namespace

Float32Mode float32_mode() { return g_float32_mode.load(std::memory_order_relaxed); }

void set_float32_mode(Float32Mode mode) { g_float32_mode.store(mode, std::memory_order_relaxed); }

const char* float32_mode_name(Float32Mode mode) { return mode == Float32Mode::kBf16x3 ? "bf16x3" : "pytorch"; }

std::optional<Float32Mode> float32_mode_from_name(std::string_view name) {
  for (Float32Mode mode : {Float32Mode::kPyTorch, Float32Mode::kBf16x3}) {
    if (name == float32_mode_name(mode)) return mode;
  }
  return std::nullopt;
}

const char* float32_mode_names() { return "pytorch, bf16x3"; }

}  // namespace cutlassfuse
