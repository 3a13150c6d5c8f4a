// The sm90 fused dgrad family for float32 calls: bfloat16 tensor-core operands holding
// the input and filter split into pieces (three products; float32_split.h),
// float32 accumulation, a float32 activation (every tile configuration of sm90/dgrad.h).
#include "cutlassfuse/sm90/dgrad_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsBf16x3, cutlass::bfloat16_t, float)
