// The fallback path's ReLU + GroupNorm, after a convolution computed elsewhere
// (cuDNN): y holds the deconvolution without bias; these kernels add the bias and
// apply ReLU on the fly, for any channel count, NCDHW or channels-last, float16,
// bfloat16 or float32, with 64-bit indexing.
//   relu_group_norm_stats:     one read of y; partials of ReLU(y + bias) in the
//                              TilePartials layout of generic_stats_tiles(shape), one
//                              region for group_norm_finalize (group_norm.h);
//   relu_group_norm_normalize: y = ReLU(y + bias) * scale + shift, in place.
// Against eager (bias in the conv, then ReLU and GroupNorm as separate passes) this
// saves one full read and write of the activation.
#pragma once

#include <cuda_runtime_api.h>

#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse {

enum class ActivationLayout { kChannelsFirst, kChannelsLast };  // NCDHW / NDHWC, packed

TilePartials generic_stats_tiles(const GroupNormShape& shape);

void relu_group_norm_stats(ElementType element, const void* y, ActivationLayout layout, const void* bias,
                           const GroupNormShape& shape, WelfordPartial* partials, cudaStream_t stream);

void relu_group_norm_normalize(ElementType element, void* y, ActivationLayout layout, const void* bias,
                               const void* scale_shift, const GroupNormShape& shape, cudaStream_t stream);

}  // namespace cutlassfuse
