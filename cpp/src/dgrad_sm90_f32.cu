// The sm90 fused dgrad family for float32 calls: bfloat16 tensor-core operands holding
// the input and filter split into high and low parts (three products; dispatch_cuda.cpp),
// float32 accumulation, a float32 activation (every tile configuration of dgrad_sm90.h).
#include "cutlassfuse/dgrad_sm90_launch.cuh"

CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::ElementType::kFloat32, cutlass::bfloat16_t, float)
