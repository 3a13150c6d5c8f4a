// The sm90 fused dgrad family for float32 calls at TF32's precision: float16 operands
// holding the input and filter scaled by powers of two and rounded to nearest
// (common/tf32_scaling.h), float32 accumulation, descaled in the epilogue, a float32
// activation (every tile configuration of sm90/dgrad.h).
#include "cutlassfuse/sm90/dgrad_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsTf32, cutlass::half_t, float)
