// The CUDA fallback kernel path, for calls the fused path does not take: the
// convolution through cuDNN (float32: as PyTorch runs it), then this project's ReLU +
// GroupNorm kernels (group_norm_generic.h).
#pragma once

#include "dispatch/kernel_path.h"

namespace cutlassfuse {

Routing plan_fallback_call(const Call& call);

}  // namespace cutlassfuse
