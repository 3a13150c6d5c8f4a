// The block family's sm90 fused forward convolution for bfloat16.
#include "cutlassfuse/sm90/fprop_launch.cuh"

CUTLASSFUSE_DEFINE_FPROP_FAMILY(cutlassfuse::MathMode::kBFloat16, cutlass::bfloat16_t)
