// RMS normalization over the channels of each pixel, with a per-channel affine and an
// activation: out[n, c, p] = act(x[n, c, p] * r[n, p] * w[c] + b[c]), r the inverse of
// the pixel's root mean square over its C channels: 1 / sqrt(mean(x^2) + eps), or with
// `clamp` 1 / max(sqrt(mean(x^2)), eps) (F.normalize's form, times sqrt(C): diffusers'
// Wan decoder). Written as PyTorch ops (diffusers' WanRMS_norm, LTX-Video's RMSNorm over
// moved channels) it is a float32 copy, a norm reduction, a division, a rounding, two
// multiplies, an add and the activation's pass: eight full-size passes where this kernel
// reads the input once and writes once, computing in float32 and rounding once.
//
// Both layouts read each pixel's channels twice, the second time from L1 (a pixel's
// channels are read by one warp, or one block, just before): channels-last by a group of
// lanes per pixel, 16-byte vectors of channels; NCDHW by a block of 32 pixels whose warps
// share the channels, one element per lane.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

struct ChannelRMSNorm {
  int64_t batch = 0, channels = 0, pixels = 0;  // pixels: of one sample (the product of the spatial sizes)
  ElementType element = ElementType::kFloat16;
  bool channels_last = false;  // (N, pixels, C) packed; else (N, C, pixels)
  float eps = 0.f;
  bool clamp = false;
  const void* weight = nullptr;  // C values of affine_element, or none
  const void* bias = nullptr;
  ElementType affine_element = ElementType::kFloat32;
  ActivationConstant activation;  // not PReLU
};

// Whether channel_rms_norm takes `p`: 1 to 2^31 - 1 elements; channels-last: channels a
// multiple of 8 (16-byte vectors); an activation other than PReLU.
bool channel_rms_norm_takes(const ChannelRMSNorm& p);

// out = the normalization of `input`, both packed in p's layout; channels-last pointers
// aligned to 16 bytes.
void channel_rms_norm(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream);

}  // namespace cutlassfuse
