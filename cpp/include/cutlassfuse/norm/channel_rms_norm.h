// RMS normalization over the channels of each pixel, with a per-channel affine and an
// activation: out[n, c, p] = act(x[n, c, p] * r[n, p] * w[c] + b[c]), r the inverse of
// the pixel's root mean square over its C channels: 1 / sqrt(mean(x^2) + eps), or with
// `clamp` 1 / max(sqrt(mean(x^2)), eps) (F.normalize's form, times sqrt(C): diffusers'
// Wan decoder). Written as PyTorch ops (diffusers' WanRMS_norm, LTX-Video's RMSNorm over
// moved channels) it is a float32 copy, a norm reduction, a division, a rounding, two
// multiplies, an add and the activation's pass: eight full-size passes where this kernel
// reads the input once and writes once, computing in float32 and rounding once.
//
// Any dense layout is one of two: channels innermost (channels-last), each pixel's C
// channels adjacent, read by a group of lanes per pixel that hold them in registers; or
// `planes` blocks of C channels of `pixels` adjacent elements each (NCDHW: a plane per
// sample; a (N, T, C, H, W) tensor viewed as (N, C, T, H, W): a plane per frame), read by
// a block per 32 lanes of pixels (two adjacent pixels a lane on large tensors) whose warps
// share the channels, the second read from L1.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

struct ChannelRMSNorm {
  // Element (plane, c, pixel) at (plane * channels + c) * pixels + pixel; channels-last:
  // pixel (plane * pixels + pixel)'s channels adjacent.
  int64_t planes = 0, channels = 0, pixels = 0;
  ElementType element = ElementType::kFloat16;
  bool channels_last = false;
  float eps = 0.f;
  bool clamp = false;
  const void* weight = nullptr;  // C values of affine_element (float32 or `element`), or none
  const void* bias = nullptr;
  ElementType affine_element = ElementType::kFloat32;
  ActivationConstant activation;  // not PReLU
};

// Whether channel_rms_norm takes `p`: 1 to 2^31 - 1 elements; weight and bias of float32
// or the input's type; channels-last: channels a multiple of 8 up to 1024 (16-byte
// vectors, up to 4 a lane), weight and bias aligned to 16 bytes; an activation other than
// PReLU.
bool channel_rms_norm_takes(const ChannelRMSNorm& p);

// out = the normalization of `input`, both in p's layout; channels-last pointers aligned
// to 16 bytes.
void channel_rms_norm(const void* input, void* out, const ChannelRMSNorm& p, cudaStream_t stream);

}  // namespace cutlassfuse
