// The block family's sm90 fused forward convolution (sm90/fprop.h) for float16 and
// bfloat16, in one translation unit: the two kernels differ in their element type only
// and share most of their template instantiations (docs/architecture.md, "The build").
#include "cutlassfuse/sm90/fprop_launch.cuh"

CUTLASSFUSE_DEFINE_FPROP_FAMILY(cutlassfuse::MathMode::kFloat16, cutlass::half_t)
CUTLASSFUSE_DEFINE_FPROP_FAMILY(cutlassfuse::MathMode::kBFloat16, cutlass::bfloat16_t)
