// The gradients of ConvTranspose3d(x, W) (stride s, padding p, output padding op,
// dilation d, no conv groups) from dz, the gradient of its output, on sm90 tensor cores
// through CUTLASS's implicit-GEMM conv kernels on channels-last operands, strided
// directly (the im2col TMA walks the stride; no sub-pixel phases, no copies of dz):
//   - input gradient: the forward convolution (cross-correlation) of dz [N, O, Cout] with
//     W read as [Cin, T, R, S, Cout] (W channels-last), stride s, dilation d, padding p
//     below and p - op above: dx [N, I, Cin];
//   - weight gradient: that convolution's filter gradient, dz its activation and x its
//     output gradient: dW [Cin, T, R, S, Cout] (W's gradient channels-last).
// fp16/bf16 operands and results, fp32 accumulation; deterministic (no split-K).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "cutlassfuse/plan/math_mode.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse::sm90 {

// Where the kernels cannot run `problem`'s gradients ("" where they can): conv groups,
// channels not multiples of 8, CUTLASS's limits on padding and filter reach, or an output
// padding that a non-negative upper padding cannot express.
std::string conv_gradient_rejection(const Problem& problem);

// Where the kernels are preferred to cuDNN for a layer they take, by the measured rule
// (docs/performance.md): strided layers whose input channels fill the kernels' 128-wide
// channel tiles; for the weight gradient, also enough output tiles to fill most of the
// GPU, since its K mode (every output pixel) is not split.
bool input_gradient_preferred(const Problem& problem);
bool weight_gradient_preferred(const Problem& problem);

// dz: [N, O, Cout] NDHWC; filter: W as [Cin, T, R, S, Cout]; dx: [N, I, Cin] NDHWC.
template <MathMode Math>
void conv_transpose_input_gradient(const Problem& problem, const void* dz, const void* filter, void* dx, int sm_count,
                                   cudaStream_t stream);

// dz: [N, O, Cout] NDHWC; x: [N, I, Cin] NDHWC; dw: [Cin, T, R, S, Cout].
template <MathMode Math>
void conv_transpose_weight_gradient(const Problem& problem, const void* dz, const void* x, void* dw, int sm_count,
                                    cudaStream_t stream);

}  // namespace cutlassfuse::sm90
