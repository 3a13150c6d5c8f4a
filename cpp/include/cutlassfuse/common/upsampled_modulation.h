// A normalized activation modulated by tensors of a lower resolution, nearest-upsampled:
// out = act(input * up(scale) + up(shift)), `up` PyTorch's nearest upsampling of the
// (N, C, d, h, w) scale and shift to the input's (D, H, W) (upsample_nearest.h's index map,
// causal frames included). Spatially conditioned norms (diffusers' CogVideoX decoder: the
// latent's 1x1x1 convolutions as scale and shift) written as PyTorch ops upsample both to
// the full size, multiply and add: five full-size writes where this pass has one. The
// small tensors stay in L2; each thread reads 8 channels of an output pixel and of its
// source pixel (16 bytes of 16-bit elements), computes in float32 and rounds once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/common/upsample_nearest.h"
#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

struct UpsampledModulation {
  UpsampleNearest3d grid;  // input: the scale's and shift's sizes; output: the input's and out's
  ElementType element;
  ActivationConstant activation;  // not PReLU
};

// Whether upsampled_modulation takes `p`: upsample_nearest3d's bounds, channels a multiple
// of 8, an activation other than PReLU.
bool upsampled_modulation_takes(const UpsampledModulation& p);

// out = act(input * up(scale) + up(shift)), every tensor packed NDHWC (channels-last),
// every pointer aligned to 16 bytes.
void upsampled_modulation(const void* input, const void* scale, const void* shift, void* out,
                          const UpsampledModulation& p, cudaStream_t stream);

}  // namespace cutlassfuse
