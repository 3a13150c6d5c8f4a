// The block family's sm90 fused forward convolution for float16.
#include "cutlassfuse/sm90/fprop_launch.cuh"

CUTLASSFUSE_DEFINE_FPROP_FAMILY(cutlassfuse::MathMode::kFloat16, cutlass::half_t)
