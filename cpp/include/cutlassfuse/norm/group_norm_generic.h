// The fallback path's ReLU + GroupNorm, after a convolution computed elsewhere
// (cuDNN): y holds the deconvolution without bias; these kernels add the bias and
// apply ReLU on the fly, for any channel count, NCDHW or channels-last, float16,
// bfloat16 or float32, with 64-bit indexing.
//   relu_group_norm_stats:     one read of y; partials of ReLU(y + bias) in the
//                              TilePartials layout of generic_stats_tiles(shape), one
//                              region for group_norm_finalize (group_norm.h);
//   relu_group_norm_normalize: ReLU(y + bias) * scale + shift, in place; or, for a
//                              call that keeps what its backward reads, into a
//                              separate output (y's layout) beside the activation
//                              ReLU(y + bias), NDHWC, in the same pass.
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

// Where relu_group_norm_normalize writes. Both null: y in place. Keeping: `out` in y's
// layout and `activation` NDHWC, which may be y itself when y is NDHWC (each element
// is read and written by one thread).
struct NormalizeOutputs {
  void* out = nullptr;
  void* activation = nullptr;
};

void relu_group_norm_normalize(ElementType element, void* y, ActivationLayout layout, const void* bias,
                               const void* scale_shift, const GroupNormShape& shape, const NormalizeOutputs& outputs,
                               cudaStream_t stream);

}  // namespace cutlassfuse
