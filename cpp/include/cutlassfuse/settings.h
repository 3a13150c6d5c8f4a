// Process-wide settings of the op, as torch.backends keeps PyTorch's: validated here
// (the Python setters only forward values), guarded by one lock, and read once at the
// start of a call as its CallOptions, which travel down the call to the kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "cutlassfuse/sm90/dgrad_config.h"

namespace cutlassfuse {

// How float32 calls compute the convolution (a user setting: cutlassfuse.set_float32_mode).
enum class Float32Mode {
  // As PyTorch runs it under its current switches (TF32 where torch.backends.cudnn's
  // conv switch allows it, strict fp32 otherwise; deterministic and benchmark as set),
  // then this project's bias + ReLU + GroupNorm kernels. The default: the op's float32
  // numerics are those of the modules it replaces.
  kPyTorch,
  // The fused tensor-core path at TF32's precision: operands rounded to nearest with
  // TF32's significand, as PyTorch's TF32 convolutions round them, float32 accumulation,
  // on float16 tensor cores after a power-of-two scaling (math_mode.h).
  kTf32,
  // The fused tensor-core path, each float32 operand split into bfloat16 pieces and the
  // products summed in fp32 (float32_split.h).
  kBf16x3,
};

const char* float32_mode_name(Float32Mode mode);
std::optional<Float32Mode> float32_mode_from_name(std::string_view name);
// The names float32_mode_from_name knows, comma-separated (for error messages).
const char* float32_mode_names();

// Which kernels compute the backward's convolution gradients (float16/bfloat16 on sm_90).
enum class ConvGradients {
  // Per gradient, this project's CUTLASS kernels where the measured rule prefers them
  // (sm90/conv_gradients.h), ATen's convolution_backward elsewhere.
  kAuto,
  kAten,     // ATen's convolution_backward (cuDNN under PyTorch's switches) everywhere
  kCutlass,  // the CUTLASS kernels wherever they take the layer
};

const char* conv_gradients_name(ConvGradients choice);
std::optional<ConvGradients> conv_gradients_from_name(std::string_view name);
const char* conv_gradients_names();

// Switches for benchmarking the kernels (cutlassfuse.backends); the defaults are what
// the op is built to run.
struct BackendFlags {
  bool fused_path = true;                         // false: CUDA calls take the fallback
  std::optional<sm90::DgradConfig> dgrad_config;  // pinned; nothing: the heuristic
  // The ping-pong kernel's tiles skip the K blocks of depth taps reaching none of their
  // pixels (tap_window.h), where that pays.
  bool skip_border_taps = true;
  // The ping-pong kernel's CTAs draw their tiles from a counter (unit_schedule.cuh),
  // where that pays; false: each walks a static list.
  bool drawn_tile_schedule = true;
  int64_t phase_streams = 1;  // streams a call's sub-pixel phases are spread over, 1 to 8
  ConvGradients conv_gradients = ConvGradients::kAuto;
  // The standalone norm and the fallback blocks' norm run as one resident launch where
  // that kernel takes the call (norm/group_norm_resident.h); false: the statistics,
  // finalize and normalize launches.
  bool resident_norm = true;
};
inline constexpr int64_t kMaxPhaseStreams = 8;

// What one call runs under.
struct CallOptions {
  Float32Mode float32_mode = Float32Mode::kPyTorch;
  BackendFlags backend;
};

// The settings now, for a call about to start.
CallOptions current_options();

void set_float32_mode(Float32Mode mode);
// Replaces the flags with change(current flags) as one step under the settings' lock,
// and returns the flags before. Throws c10::ValueError, changing nothing, when `change`
// throws or gives a phase stream count outside 1..8.
BackendFlags exchange_backend_flags(const std::function<BackendFlags(BackendFlags)>& change);

}  // namespace cutlassfuse
