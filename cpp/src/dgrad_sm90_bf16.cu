// The sm90 fused dgrad family for bfloat16 (every tile configuration of dgrad_sm90.h).
#include "cutlassfuse/dgrad_sm90_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::ElementType::kBFloat16, cutlass::bfloat16_t, cutlass::bfloat16_t)
