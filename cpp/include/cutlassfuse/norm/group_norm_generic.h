// GroupNorm with an activation before and after it, over a tensor y computed
// elsewhere (a convolution's output without its bias, from cuDNN, or a norm's input).
// The kernels add the bias and apply the activations on the fly, for any channel
// count, NCDHW or channels-last, float16, bfloat16 or float32, with 64-bit indexing:
//   pre(y) = activate(pre.activation, y + bias)     the value the norm reads
//   out    = activate(after, pre(y) * scale + shift) (scale, shift: group_norm_finalize's)
// with kIdentity where there is no activation.
//   norm_activation_stats:     one read of y; partials of pre(y) in the TilePartials
//                              layout of generic_stats_tiles(shape, sm_count), one
//                              region for group_norm_finalize (group_norm.h);
//   norm_activation_normalize: out in place, or into a separate output in y's layout
//                              (or NCDHW from an NDHWC y), optionally with pre(y)
//                              written NDHWC beside it in the same pass (what the
//                              backward of ReLU + GroupNorm reads).
// The activations' kinds are runtime values: one kernel per element type and layout
// serves them all, each thread branching on a kind once per batch of values. Against
// eager (the bias in the convolution, the activation and GroupNorm as separate passes)
// this saves the bias and activation passes.
#pragma once

#include <cuda_runtime_api.h>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/plan/activation.h"

namespace cutlassfuse {

enum class ActivationLayout { kChannelsFirst, kChannelsLast };  // NCDHW / NDHWC, packed

// The statistics pass's tiles for a GPU of `sm_count` SMs: as many as stay resident at
// once, so that each block pays its reduction once and no partial wave is left over.
TilePartials generic_stats_tiles(const GroupNormShape& shape, int sm_count);

// The value the norm reads: y + bias, then the activation before the norm (kIdentity: none).
struct PreNorm {
  const void* bias = nullptr;  // y's element type, one per channel; null: none
  ActivationParams activation;
};

// `tiles`: generic_stats_tiles(shape, ...), the layout `partials` was sized for.
void norm_activation_stats(ElementType element, const void* y, ActivationLayout layout, const PreNorm& pre,
                           const GroupNormShape& shape, const TilePartials& tiles, WelfordPartial* partials,
                           cudaStream_t stream);

// Where norm_activation_normalize writes. Both null: y in place. `out` alone: the
// output in y's layout, y left as it is; with out_channels_first, the output NCDHW
// whatever y's layout (from an NDHWC y through an on-chip transpose: what spares a
// convolution run on channels-last operands the transpose of its output). Keeping what
// the backward of ReLU + GroupNorm reads: `out` in y's layout and `activation` (pre(y))
// NDHWC, which may be y itself when y is NDHWC (each element is read and written by one
// thread); not with an NCDHW `out` from an NDHWC y. `residual`, where given, is added to
// the output (a block's residual connection): the output's shape, element type and
// layout, never the output itself.
struct NormalizeOutputs {
  void* out = nullptr;
  void* activation = nullptr;
  bool out_channels_first = false;
  const void* residual = nullptr;
};

// out = after(pre(y) * scale + shift) [+ residual], scale_shift: float2 per (sample, channel).
void norm_activation_normalize(ElementType element, void* y, ActivationLayout layout, const PreNorm& pre,
                               const void* scale_shift, const ActivationParams& after, const GroupNormShape& shape,
                               const NormalizeOutputs& outputs, cudaStream_t stream);

}  // namespace cutlassfuse
