// The fused sm90 kernel path: per sub-pixel phase (or one pixel-shuffle GEMM), a
// CUTLASS dgrad whose epilogue adds the bias, applies ReLU and reduces GroupNorm
// partial statistics; then the finishing kernel (finalize + normalize).
#pragma once

#include "dispatch/kernel_path.h"

namespace cutlassfuse::sm90 {

Routing plan_fused_call(const Call& call);

}  // namespace cutlassfuse::sm90
