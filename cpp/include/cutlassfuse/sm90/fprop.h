// Host interface of the Hopper (sm90a) fused forward convolution of the block family
// (block.h):
//
//     y = act(Conv3d(input, weight) + bias), stored NDHWC,
//     plus GroupNorm partial statistics of the stored values (TilePartials layout),
//
// where act is the activation before the norm (identity when it follows the norm: the
// normalize applies it). A CUTLASS 3.x implicit-GEMM fprop (TMA im2col loads with the
// layer's stride, padding and dilation; wgmma) on the persistent ping-pong kernel
// (dgrad_pingpong.cuh), whose epilogue visitor tree adds the bias, applies the
// activation (block_activation_node.cuh), stores, and reduces the statistics
// (group_norm_stats_visitor.cuh). GEMM view: M = batch * output pixels,
// N = out_channels, K = in_channels * taps. float16 and bfloat16.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/plan/activation.h"
#include "cutlassfuse/plan/math_mode.h"
#include "cutlassfuse/plan/problem.h"
#include "cutlassfuse/sm90/dgrad_config.h"  // TileExtent

namespace cutlassfuse::sm90 {

// The CTA tile of the ping-pong kernel's consumer warpgroup: 256 output pixels x 32
// channels, K blocks of 32 input channels of one filter tap. A K block's TMA loads and
// barriers cost the producer about the same whatever the block's size, so the tile is
// as tall as one warpgroup's accumulators allow at this width. Layers whose channels
// the tile does not fit multiply padding channels (16 of 32 in a 16-channel layer):
// plan_fused_block routes only those it fits (docs/performance.md has the data).
inline constexpr TileExtent kFpropTile{256, 32};
inline constexpr int kFpropTileK = 32;

struct FpropOperands {
  const void* input;         // [N, D, H, W, Cin] (NDHWC, packed)
  const void* filter;        // [Cout, T, R, S, Cin]: PyTorch's weight in channels-last order
  const void* bias;          // [Cout] of the output's type, or nullptr
  const float* slopes;       // [Cout] PReLU slopes, or nullptr (any other activation)
  void* output;              // [N, Do, Ho, Wo, Cout] (NDHWC, packed)
  WelfordPartial* partials;  // TilePartials::for_tiles(shape, kFpropTile.m, kFpropTile.n) slots
};

// Empty when the kernel can run `problem` (forward, ungrouped), else why not: this
// kernel's rules and CUTLASS's can_implement (TMA im2col limits).
template <MathMode M>
std::string fprop_unsupported_reason(const Problem& problem);

// Launches the kernel on `stream`, the epilogue applying `activation` (the one before the
// norm; identity when it follows the norm; PReLU's slopes from operands.slopes). Throws
// std::runtime_error if CUTLASS refuses or the launch fails.
template <MathMode M>
void fprop_fused(const Problem& problem, const FpropOperands& operands, const ActivationConstant& activation,
                 int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse::sm90
