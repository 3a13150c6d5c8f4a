// The sm90 fused family for float32 calls on TF32 tensor cores: float32 operands
// rounded to nearest TF32 beforehand (sm90/left_operand.h; wgmma ignores the low
// mantissa bits), float32 accumulation and activation. TF32 wgmma reads both operands
// K-major, so each phase runs as the forward convolution of the input view with the
// reversed K-major filter (subpixel.h), clusters of one.
#include "cutlassfuse/sm90/dgrad_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsTf32, float, float, cutlass::conv::Operator::kFprop)
