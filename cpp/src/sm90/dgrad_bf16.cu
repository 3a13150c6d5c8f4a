// The sm90 fused dgrad family for bfloat16 (every tile configuration of sm90/dgrad.h).
#include "cutlassfuse/sm90/dgrad_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kBFloat16, cutlass::bfloat16_t, cutlass::bfloat16_t)
