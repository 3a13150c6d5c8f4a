// The activations a block applies, as PyTorch defines them: one definition of each
// (value and derivative) that the kernels, the host code and the backward share.
// Adding an activation is an enum value, its name, and a case in each function below.
//
// Position: before the norm (the norm's statistics are of the activated values,
// nn.Sequential(conv, act, norm)) or after it (statistics of the convolution's output,
// the activation applied to the normalized values, nn.Sequential(conv, norm, act)).
//
// Plain C++ with CUTLASSFUSE_HOST_DEVICE functions, so that host code and kernels read
// the same definitions.
#pragma once

#include <cmath>
#include <optional>
#include <string_view>

#include "cutlassfuse/common/host_device.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

enum class ActivationKind : int {
  kIdentity,   // nn.Identity
  kReLU,       // nn.ReLU
  kLeakyReLU,  // nn.LeakyReLU(negative_slope): parameter = negative_slope
  kPReLU,      // nn.PReLU(num_parameters): learned slopes, 1 or one per channel
  kSiLU,       // nn.SiLU
  kGELU,       // nn.GELU(approximate="none")
  kGELUTanh,   // nn.GELU(approximate="tanh")
  kELU,        // nn.ELU(alpha): parameter = alpha
};

enum class ActivationPosition : int { kBeforeNorm, kAfterNorm };

// The names the op's schema takes, in enum order.
inline constexpr std::string_view kActivationNames[] = {"identity", "relu", "leaky_relu", "prelu",
                                                        "silu",     "gelu", "gelu_tanh",  "elu"};

inline std::optional<ActivationKind> activation_from_name(std::string_view name) {
  for (int i = 0; i < static_cast<int>(std::size(kActivationNames)); ++i) {
    if (kActivationNames[i] == name) return static_cast<ActivationKind>(i);
  }
  return std::nullopt;
}

inline std::string_view activation_name(ActivationKind kind) { return kActivationNames[static_cast<int>(kind)]; }

// What a kernel needs of an activation: its kind, its constant (LeakyReLU's slope,
// ELU's alpha) and, for PReLU, its learned slopes.
struct ActivationParams {
  ActivationKind kind = ActivationKind::kIdentity;
  float parameter = 0.f;
  const void* slopes = nullptr;  // PReLU: `slope_count` values of slopes_element
  ElementType slopes_element = ElementType::kFloat32;
  int64_t slope_count = 0;  // 1, or the channels
};

// An activation's kind and its one constant (LeakyReLU's slope, ELU's alpha), as the
// fused convolution's epilogue takes it (PReLU's per-channel slopes come as an operand).
struct ActivationConstant {
  ActivationKind kind = ActivationKind::kIdentity;
  float parameter = 0.f;
};

// tanh through expf: the kernels build with fast math, where tanhf is the hardware's
// approximation (about 2^-11 relative error), far coarser than PyTorch's tanh.
CUTLASSFUSE_HOST_DEVICE float accurate_tanh(float x) {
  const float magnitude = 1.f - 2.f / (expf(2.f * fabsf(x)) + 1.f);
  return copysignf(magnitude, x);
}

// The activation's constant for a channel: PReLU's slope of that channel (read by
// the caller, see ActivationParams::slopes), the parameter otherwise.
CUTLASSFUSE_HOST_DEVICE float activate(ActivationKind kind, float x, float parameter) {
  constexpr float kSqrt1_2 = 0.70710678118654752f;
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  switch (kind) {
    case ActivationKind::kIdentity: return x;
    // NaN propagates, as in torch.relu.
    case ActivationKind::kReLU: return x > 0.f || x != x ? x : 0.f;
    case ActivationKind::kLeakyReLU:
    case ActivationKind::kPReLU: return x > 0.f ? x : x * parameter;
    case ActivationKind::kSiLU: return x / (1.f + expf(-x));
    case ActivationKind::kGELU: return 0.5f * x * (1.f + erff(x * kSqrt1_2));
    case ActivationKind::kGELUTanh: return 0.5f * x * (1.f + accurate_tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    case ActivationKind::kELU: return x > 0.f ? x : parameter * expm1f(x);
  }
  return x;
}

// d activate(kind, x, parameter) / dx, as PyTorch's backward kernels compute it (ReLU
// and LeakyReLU take the negative side's value at 0).
CUTLASSFUSE_HOST_DEVICE float activation_derivative(ActivationKind kind, float x, float parameter) {
  constexpr float kSqrt1_2 = 0.70710678118654752f;
  constexpr float kSqrt2OverPi = 0.79788456080286536f;
  constexpr float kInvSqrt2Pi = 0.39894228040143268f;
  switch (kind) {
    case ActivationKind::kIdentity: return 1.f;
    case ActivationKind::kReLU: return x > 0.f ? 1.f : 0.f;
    case ActivationKind::kLeakyReLU:
    case ActivationKind::kPReLU: return x > 0.f ? 1.f : parameter;
    case ActivationKind::kSiLU: {
      const float s = 1.f / (1.f + expf(-x));
      return s * (1.f + x * (1.f - s));
    }
    case ActivationKind::kGELU: return 0.5f * (1.f + erff(x * kSqrt1_2)) + x * kInvSqrt2Pi * expf(-0.5f * x * x);
    case ActivationKind::kGELUTanh: {
      const float inner = kSqrt2OverPi * (x + 0.044715f * x * x * x);
      const float t = accurate_tanh(inner);
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrt2OverPi * (1.f + 3.f * 0.044715f * x * x);
    }
    case ActivationKind::kELU: return x > 0.f ? 1.f : parameter * expf(x);
  }
  return 1.f;
}

}  // namespace cutlassfuse
