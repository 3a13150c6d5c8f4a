// A direct 3-D convolution for layers of few channels (a network's last layer, such as
// MONAI UNet's Conv3d(2, 2, 3)), which cuDNN runs with kernels far from memory bandwidth:
// a thread computes four consecutive output pixels along W, all their output channels,
// from the input pixels under the filter, which is in shared memory; filters of three taps
// along W at stride and dilation 1 there (most of these layers) load each input row once
// per channel and unroll every multiply-add (docs/performance.md has the times).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// Channel counts up to this, in and out; the filter, its output channels padded to 1, 2,
// 4 or 8, in float in 48 KB of shared memory.
constexpr int64_t kDirectConvMaxChannels = 8;
constexpr int64_t kDirectConvMaxFilterBytes = 48 * 1024;

// Element strides of a 5-D tensor [N, C, D, H, W], any layout.
using Strides5 = std::array<int64_t, 5>;

struct DirectConv3dProblem {
  int batch, in_channels, out_channels;
  std::array<int, 3> input_size, output_size, kernel_size, stride, padding, dilation;
  Strides5 input_strides, output_strides, weight_strides;  // weight [Cout, Cin, kD, kH, kW]
};

// The kernel's work items (a few output pixels along W each); they must fit in 31 bits.
int64_t direct_conv3d_work_items(const DirectConv3dProblem& problem);

// out = conv3d(input, weight) + bias (bias: [out_channels] or nullptr), every element of
// one type (float16, bfloat16 or float32), sums in float. Channel counts up to
// kDirectConvMaxChannels, the filter within kDirectConvMaxFilterBytes as float with 8
// output channels, and the work items within 31 bits.
void direct_conv3d(ElementType element, const void* input, const void* weight, const void* bias, void* out,
                   const DirectConv3dProblem& problem, int sm_count, cudaStream_t stream);

}  // namespace cutlassfuse
