// Host interface of the ReLU + GroupNorm backward kernels: from the output gradient dy
// and what the forward kept (the activation a = ReLU(z), z the convolution with its
// bias, and per-(sample, group) mean and rstd), the gradient of z, gamma, beta and the
// convolution's bias. a and dy are [batch, spatial, channels] (channels-last), any
// channel count (16-byte accesses of 8 channels where the channels and pointers allow);
// every sum is fp32, in a fixed order (no atomics), so results repeat
// bit for bit.
//   1. sums:         per (sample, chunk of pixels, channel): sum dy and sum dy * a;
//   2. coefficients: per (sample, group): those sums over the chunks and the group's
//                    channels give dz = [a > 0] * (c1[n, c] * dy + c2[n, g] * a + c3[n, g]),
//                    and per (sample, channel) the terms of dgamma and dbeta;
//   3. grad:         dz, written once, with per (sample, chunk, channel) sums of dz for
//                    the bias gradient;
//   4. parameter grads: dgamma, dbeta and the bias gradient, the per-sample and
//                    per-chunk terms summed in a fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse {

struct GroupNormBackwardShape {
  GroupNormShape norm;
  int64_t rows_per_chunk;  // pixels of a sample one block of the sums and grad kernels covers
  int64_t chunks;          // per sample

  // Enough blocks to fill `sm_count` SMs several times over.
  static GroupNormBackwardShape plan(const GroupNormShape& norm, int sm_count);
};

struct GroupNormBackwardTerms {
  float2* sums;          // [batch, chunks, channels]: (sum dy, sum dy * a)
  float* scale_dy;       // [batch, channels]: c1
  float2* group_terms;   // [batch, num_groups]: (c2, c3)
  float2* affine_terms;  // [batch, channels]: (dgamma term, dbeta term)
  float* bias_terms;     // [batch, chunks, channels]: sums of dz
};

void relu_group_norm_backward_sums(ElementType element, const void* dy, const void* activation,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   cudaStream_t stream);

// mean and rstd: [batch, num_groups] fp32; gamma: [channels] of affine_element, or nullptr.
void relu_group_norm_backward_coefficients(const GroupNormBackwardShape& shape, const float* mean, const float* rstd,
                                           const void* gamma, ElementType affine_element,
                                           const GroupNormBackwardTerms& terms, cudaStream_t stream);

// grad_pre_activation may be dy itself (written in place).
void relu_group_norm_backward_grad(ElementType element, const void* dy, const void* activation,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   void* grad_pre_activation, cudaStream_t stream);

// [channels] fp32 each.
struct ParameterGradients {
  float* gamma;
  float* beta;
  float* bias;  // the convolution's
};

void relu_group_norm_backward_parameter_grads(const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                              const ParameterGradients& out, cudaStream_t stream);

}  // namespace cutlassfuse
