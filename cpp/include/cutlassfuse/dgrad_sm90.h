// Host interface of the Hopper (sm90a) tensor-core deconvolution:
//
//     activation = ReLU(ConvTranspose3d(input, weight) + bias)
//
// computed as the data gradient (dgrad) of the Conv3d whose input is `activation`
// and whose output is `input`: a CUTLASS 3.x implicit GEMM with TMA im2col loads,
// wgmma, and an epilogue that adds the bias and applies ReLU before the TMA store.
// GEMM view: M = batch * Do * Ho * Wo, N = out_channels, K = in_channels * T * R * S.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cutlassfuse/problem.h"

namespace cutlassfuse::sm90 {

struct DgradOperands {
  const void* input;   // [N, D, H, W, Cin] (NDHWC, packed)
  const void* filter;  // [Cin, T, R, S, Cout]: PyTorch's (Cin, Cout, T, R, S) permuted
  const void* bias;    // [Cout], or nullptr for no bias
  void* activation;    // [N, Do, Ho, Wo, Cout] (NDHWC, packed)
};

// Empty when the kernel can run `problem` in `element`, else why not (for explain()
// and fallbacks). Checks the shape rules of this kernel and CUTLASS's can_implement.
std::string dgrad_bias_relu_unsupported_reason(ElementType element, const Problem& problem);

// Launches on `stream`. Throws std::runtime_error if CUTLASS refuses or the launch fails.
void dgrad_bias_relu(ElementType element, const Problem& problem, const DgradOperands& operands,
                     int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse::sm90
