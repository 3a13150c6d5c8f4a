// The sm90 fused dgrad family for float16 (every tile configuration of dgrad_sm90.h).
#include "cutlassfuse/dgrad_sm90_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::ElementType::kFloat16, cutlass::half_t, cutlass::half_t)
