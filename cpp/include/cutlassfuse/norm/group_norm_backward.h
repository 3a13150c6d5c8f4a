// Host interface of the GroupNorm backward kernels, for two ops:
//   - the ReLU + GroupNorm op's: from the output gradient dy and what its forward kept
//     (the activation a = ReLU(z), z the convolution with its bias, and per-(sample,
//     group) mean and rstd), the gradient of z, gamma, beta and the convolution's bias;
//   - the block family's (norm_activation_*): any activation before or after the norm
//     (plan/activation.h), recomputed from what that forward keeps (the convolution's
//     output y without its bias, the bias, mean and rstd, gamma and beta), the same
//     gradients and PReLU's slopes'.
// Both run the same passes. dy, a and y are [batch, spatial, channels] (channels-last),
// any channel count (the ReLU op's in 16-byte accesses of 8 channels, the family's in runs
// of 4, where the channels and pointers allow); the family's also reads NCDHW (16-byte
// runs of pixels where the planes allow). Every sum is fp32, in a fixed order (no
// atomics), so results repeat bit for bit.
//   1. sums:         per (sample, chunk of pixels, channel): sum dn and sum dn * x, x the
//                    norm's input and dn the gradient of its output (ReLU op: a and dy);
//   2. coefficients: per (sample, group): those sums over the chunks and the group's
//                    channels give dx = c1[n, c] * dn + c2[n, g] * x + c3[n, g],
//                    and per (sample, channel) the terms of dgamma and dbeta;
//   3. grad:         dz (ReLU op: [a > 0] * dx), written once, with per (sample, chunk,
//                    channel) sums of dz for the bias gradient (and of PReLU's slope terms);
//   4. parameter grads: dgamma, dbeta and the bias gradient (and PReLU's per-channel
//                    slope gradients), the per-sample and per-chunk terms summed in a
//                    fixed order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "cutlassfuse/plan/activation.h"

namespace cutlassfuse {

struct GroupNormBackwardShape {
  GroupNormShape norm;
  int64_t rows_per_chunk;  // pixels of a sample one block of the sums and grad kernels covers
  int64_t chunks;          // per sample

  // Enough blocks to fill `sm_count` SMs several times over: channels-last, a block per
  // (chunk, sample); NCDHW (plan_planes), a block per (chunk, sample and channel), the
  // chunks whole 16-byte runs of pixels.
  static GroupNormBackwardShape plan(const GroupNormShape& norm, int sm_count);
  static GroupNormBackwardShape plan_planes(const GroupNormShape& norm, int sm_count);
};

struct GroupNormBackwardTerms {
  float2* sums;          // [batch, chunks, channels]: (sum dn, sum dn * x)
  float* scale_dy;       // [batch, channels]: c1
  float2* group_terms;   // [batch, num_groups]: (c2, c3)
  float2* affine_terms;  // [batch, channels]: (dgamma term, dbeta term)
  float* bias_terms;     // [batch, chunks, channels]: sums of dz
  float* slope_terms;    // [batch, chunks, channels]: PReLU's slope terms, or nullptr
};

// The ReLU op's sums: dn = dy, x = a. The activation holds a sample's pixels in `order`:
// NDHWC, or the pixel-shuffle GEMM's space-to-depth order (fewer than 2^31 pixels per
// sample); dy and the gradient are NDHWC.
void relu_group_norm_backward_sums(ElementType element, const void* dy, const void* activation,
                                   const PixelShuffle& order, const GroupNormBackwardShape& shape,
                                   const GroupNormBackwardTerms& terms, cudaStream_t stream);

// mean and rstd: [batch, num_groups] fp32; gamma: [channels] of affine_element, or nullptr.
// c1 = rstd gamma (in scale_dy), c2 and c3 (in group_terms).
void group_norm_backward_coefficients(const GroupNormBackwardShape& shape, const float* mean, const float* rstd,
                                      const void* gamma, ElementType affine_element,
                                      const GroupNormBackwardTerms& terms, cudaStream_t stream);

// The ReLU op's grad. grad_pre_activation may be dy itself (written in place).
void relu_group_norm_backward_grad(ElementType element, const void* dy, const void* activation,
                                   const PixelShuffle& order, const GroupNormBackwardShape& shape,
                                   const GroupNormBackwardTerms& terms, void* grad_pre_activation, cudaStream_t stream);

// [channels] fp32 each.
struct ParameterGradients {
  float* gamma;
  float* beta;
  float* bias;              // the convolution's
  float* slopes = nullptr;  // PReLU's per channel, from terms.slope_terms; nullptr: none
};

void group_norm_backward_parameter_grads(const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                         const ParameterGradients& out, cudaStream_t stream);

// What the block family's sums and grad read besides dy and y, all packed in `layout`
// (dy, y and dz alike):
//   activation before the norm: x = act(y + bias), dn = dy, dz = dx * act'(y + bias),
//     PReLU's slope terms dx * min(y + bias, 0);
//   after it: x = y + bias, v = x * rstd gamma + beta - mean rstd gamma (the forward's
//     normalize), dn = dy * act'(v), dz = dx, slope terms dy * min(v, 0).
struct NormActivationBackward {
  ActivationLayout layout;
  const void* bias;   // [channels] of y's element type, or nullptr
  const float* mean;  // [batch, num_groups]
  const float* rstd;  // [batch, num_groups]
  GroupNormAffine affine;
  ActivationParams activation;
  bool before_norm;
};

// `shape` planned by plan() for channels-last, plan_planes() for NCDHW.
void norm_activation_backward_sums(ElementType element, const void* dy, const void* y, const NormActivationBackward& op,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms,
                                   cudaStream_t stream);

// Reads terms' group_terms (c2, c3) and, for PReLU, writes terms.slope_terms; c1 is
// recomputed (rstd gamma). dz may be dy itself (written in place).
void norm_activation_backward_grad(ElementType element, const void* dy, const void* y, const NormActivationBackward& op,
                                   const GroupNormBackwardShape& shape, const GroupNormBackwardTerms& terms, void* dz,
                                   cudaStream_t stream);

}  // namespace cutlassfuse
