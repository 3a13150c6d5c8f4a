// torch.ops.cutlassfuse.channel_rms_norm (channel_rms_norm_registration.cpp): RMS
// normalization over the channels (dimension 1) of each pixel, a per-channel affine and an
// activation, through this project's kernel on CUDA where it applies
// (cutlassfuse/norm/channel_rms_norm.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string_view>

#include "cutlassfuse/plan/activation.h"

namespace cutlassfuse {

// The activation of a valid call; raises PyTorch-style errors for an invalid one (rank,
// types, devices, the affine's shapes, a negative eps, the activation's name; PReLU, whose
// slopes the op does not take).
ActivationKind check_channel_rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                      const std::optional<at::Tensor>& bias, double eps, std::string_view activation);

// ATen's ops in the input's opmath type (float32 for 16-bit input), one rounding to the
// input's type at the end; the output with the input's strides. The op's reference and
// its kernel outside the CUDA kernel's scope.
at::Tensor aten_channel_rms_norm(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                 c10::string_view activation, double activation_parameter);

// The op's CUDA kernel (norm/channel_rms_norm_op.cpp).
at::Tensor channel_rms_norm_cuda(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                                 const std::optional<at::Tensor>& bias, double eps, bool clamp,
                                 c10::string_view activation, double activation_parameter);

}  // namespace cutlassfuse
