// Output pixels of a deconvolution that no input reaches (kernel smaller than stride,
// dilation sharing factors with stride, padding beyond the kernel's reach, output
// padding past the last input) hold ReLU(bias). The sub-pixel phases leave them out
// (subpixel.h); this kernel writes them, before the phases run.
#pragma once

#include <cuda_runtime_api.h>

#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// activation: [batch, Do, Ho, Wo, out_channels] packed; bias: [out_channels] of the
// same element type, or nullptr (zeros). out_channels must be a multiple of 8.
// float16, bfloat16 or float32.
void fill_unreached_pixels(ElementType element, void* activation, const void* bias, const Problem& problem,
                           cudaStream_t stream);

}  // namespace cutlassfuse
