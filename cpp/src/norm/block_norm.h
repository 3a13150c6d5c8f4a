// The block family's normalization on the host: what both kernel paths run after the
// convolution's statistics are in a partials workspace (from the fused convolution's
// epilogue, or from norm_activation_stats): the finalize (group_norm.h), then the
// normalize with the activation after the norm (group_norm_generic.h).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "cutlassfuse/norm/group_norm_resident.h"

namespace cutlassfuse {

// The tensors the kernels read besides the activation's input, kept alive for a call.
struct KernelOperands {
  std::optional<at::Tensor> bias, gamma, beta, slopes;
};

struct NormResult {
  at::Tensor out, mean, rstd;
};

// A call's partials, one region laid out as `tiles` over `shape`, and the finalize's
// per-channel scale and shift after them: one allocation, as the host's time per call
// counts on small layers.
struct StatisticsWorkspace {
  at::Tensor bytes;
  SingleRegionSources sources;
  void* scale_shift = nullptr;

  StatisticsWorkspace(const TilePartials& tiles, const GroupNormShape& shape, const at::TensorOptions& options);
  // What the partials' values lack, added to each mean (StatisticsFinalize::mean_shift).
  const void* mean_shift = nullptr;

  WelfordPartial* data() const { return static_cast<WelfordPartial*>(bytes.data_ptr()); }
};

// The norm's affine parameters and the activations around it, as the kernels read them.
struct NormEpilogue {
  const std::optional<at::Tensor>& gamma;
  const std::optional<at::Tensor>& beta;
  PreNorm pre;  // what the normalize adds to y before normalizing (bias, activation before the norm)
  ActivationParams after;
  std::optional<at::Tensor> residual;  // added to the output, in the output's layout; absent: none
};

// The layout of a packed NCDHW or NDHWC tensor.
ActivationLayout layout_of(const at::Tensor& y);

// Statistics, finalize and normalize of `y` (packed NCDHW or NDHWC) in one resident
// launch (group_norm_resident.h), into `out` when given (y's layout) else in place;
// mean and rstd when `keep`. Nothing where that kernel does not take the call or the
// resident_norm backend flag is off: the caller runs the separate launches.
std::optional<NormResult> resident_norm(const at::Tensor& y, const std::optional<at::Tensor>& out,
                                        const NormEpilogue& norm, const Problem& p, bool keep,
                                        KernelOperands& operands);

// Whether resident_norm takes a call on a tensor of `type` in `format` at `data` (absent:
// a new allocation) written in its layout, with the residual at `residual` (or none),
// under the current backend flags.
bool resident_norm_takes(at::ScalarType type, at::MemoryFormat format, const void* data, const void* residual,
                         const Problem& p);

// Finalize and normalize `y` (packed NCDHW or NDHWC) whose partials are in `stats`:
// into `out` when given (y's layout, or NCDHW), else in place; mean and rstd when `keep`.
NormResult finish_norm(const at::Tensor& y, const std::optional<at::Tensor>& out, const StatisticsWorkspace& stats,
                       const NormEpilogue& norm, const Problem& p, bool keep, KernelOperands& operands);

}  // namespace cutlassfuse
