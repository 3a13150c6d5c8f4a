// torch.ops.cutlassfuse.upsampled_modulation (upsampled_modulation_registration.cpp):
// act(input * up(scale) + up(shift)), `up` PyTorch's nearest upsampling to the input's
// frames and pixels (with causal_frames, frame 0 from frame 0 and the later frames from the
// later ones, upsampled apart), through this project's pass on CUDA where it applies.
#pragma once

#include <ATen/ATen.h>

#include <string_view>

#include "cutlassfuse/plan/activation.h"

namespace cutlassfuse {

// The activation of a valid call; raises PyTorch-style errors for an invalid one (ranks,
// sizes, types, devices, the activation's name; PReLU, whose slopes the op does not take).
ActivationKind check_upsampled_modulation(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                          std::string_view activation);

// ATen's ops: the upsampled scale and shift, one addcmul (opmath, one rounding), the
// activation; the output in the input's suggested memory format. The op's reference and
// its kernel outside the CUDA pass's scope.
at::Tensor aten_upsampled_modulation(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                     bool causal_frames, c10::string_view activation, double activation_parameter);

// The op's CUDA kernel (common/upsampled_modulation_op.cpp).
at::Tensor upsampled_modulation_cuda(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& shift,
                                     bool causal_frames, c10::string_view activation, double activation_parameter);

}  // namespace cutlassfuse
