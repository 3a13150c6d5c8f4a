// The sm90 fused dgrad family for float16 (every tile configuration of sm90/dgrad.h).
#include "cutlassfuse/sm90/dgrad_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat16, cutlass::half_t, cutlass::half_t)
