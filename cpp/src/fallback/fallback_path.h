// The CUDA fallback kernel path, for calls the fused path does not take: the
// convolution through cuDNN (float32: as PyTorch runs it), then this project's ReLU +
// GroupNorm kernels (group_norm_generic.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "dispatch/block_path.h"
#include "dispatch/kernel_path.h"

namespace cutlassfuse {

Routing plan_fallback_call(const Call& call);
// The block family's: cuDNN's convolution without its bias, then the statistics,
// finalize and normalize kernels.
BlockRouting plan_fallback_block(const BlockCall& call);

// The convolution (transposed or not) without its bias, in the layout cuDNN gives:
// float32 as PyTorch runs it under its switches (ATen's convolution, the call nn.Conv3d
// and nn.ConvTranspose3d make), float16/bfloat16 through cuDNN's deterministic
// algorithms, so that two calls are bitwise equal.
at::Tensor convolution_without_bias(const at::Tensor& input, const at::Tensor& weight, const ConvTransposeGeometry& g,
                                    bool transposed);

// Why this project's statistics and normalize kernels (group_norm_generic.h) do not
// take a tensor of this device, dtype and batch; empty when they do.
std::string generic_kernels_unsupported_reason(const at::Tensor& input, int64_t batch);
// The same of the whole pipeline: cuDNN's convolution of problem `p` from `input`, then
// those kernels.
std::string cudnn_pipeline_unsupported_reason(const at::Tensor& input, const Problem& p);

}  // namespace cutlassfuse
