#include "cutlassfuse/settings.h"

#include <c10/util/Exception.h>

#include <mutex>

namespace cutlassfuse {
namespace {

std::mutex g_lock;
CallOptions g_settings;  // guarded by g_lock

}  // namespace

CallOptions current_options() {
  const std::lock_guard<std::mutex> lock(g_lock);
  return g_settings;
}

void set_float32_mode(Float32Mode mode) {
  const std::lock_guard<std::mutex> lock(g_lock);
  g_settings.float32_mode = mode;
}

BackendFlags exchange_backend_flags(const std::function<BackendFlags(BackendFlags)>& change) {
  const std::lock_guard<std::mutex> lock(g_lock);
  const BackendFlags previous = g_settings.backend;
  const BackendFlags flags = change(previous);
  TORCH_CHECK_VALUE(flags.phase_streams >= 1 && flags.phase_streams <= kMaxPhaseStreams,
                    "cutlassfuse: phase_streams takes 1 to ", kMaxPhaseStreams, " streams, got ", flags.phase_streams);
  g_settings.backend = flags;
  return previous;
}

const char* float32_mode_name(Float32Mode mode) {
  switch (mode) {
    case Float32Mode::kTf32: return "tf32";
    case Float32Mode::kBf16x3: return "bf16x3";
    default: return "pytorch";
  }
}

std::optional<Float32Mode> float32_mode_from_name(std::string_view name) {
  for (Float32Mode mode : {Float32Mode::kPyTorch, Float32Mode::kTf32, Float32Mode::kBf16x3}) {
    if (name == float32_mode_name(mode)) return mode;
  }
  return std::nullopt;
}

const char* float32_mode_names() { return "pytorch, tf32, bf16x3"; }

const char* conv_gradients_name(ConvGradients choice) {
  switch (choice) {
    case ConvGradients::kAten: return "aten";
    case ConvGradients::kCutlass: return "cutlass";
    default: return "auto";
  }
}

std::optional<ConvGradients> conv_gradients_from_name(std::string_view name) {
  for (ConvGradients choice : {ConvGradients::kAuto, ConvGradients::kAten, ConvGradients::kCutlass}) {
    if (name == conv_gradients_name(choice)) return choice;
  }
  return std::nullopt;
}

const char* conv_gradients_names() { return "auto, aten, cutlass"; }

}  // namespace cutlassfuse
