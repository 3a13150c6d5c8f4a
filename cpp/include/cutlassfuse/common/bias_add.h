// A convolution's bias added after it, with an optional residual in the same pass:
// out = input + bias[channel] (+ residual), for packed NCDHW or NDHWC tensors (any rank in
// NC... order), the sum in float32, rounded once to the element type. ATen adds a
// convolution's bias in a pass of its own after cuDNN's convolution, in a broadcasting
// kernel that moves one element at a time, at about half of memory bandwidth; a residual
// add after it is a second pass. Video autoencoders' resnets (conv2(h) + shortcut) pay
// both on their largest activations.
//
// Each thread adds 16 bytes of elements: channels-last, 16 bytes of consecutive channels
// and their biases, read as one vector; NCDHW, 16 bytes of one channel's plane and its
// bias. Sizes or pointers that do not allow 16 bytes take one element a thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

struct BiasAdd {
  int64_t elements;  // of the input, the residual and the output
  int64_t channels;  // dimension 1's size, the bias's length
  int64_t plane;     // elements of one channel's plane (the sizes after dimension 1), 1 where channels-last
  ElementType element;
};

// Whether bias_add takes `p`: non-empty tensors of fewer than 2^31 elements.
bool bias_add_takes(const BiasAdd& p);

// out = input + bias[channel] (+ residual where it is not null): input, residual and out
// packed alike, aligned to their elements; bias holds p.channels elements.
void bias_add(const void* input, const void* bias, const void* residual, void* out, const BiasAdd& p,
              cudaStream_t stream);

}  // namespace cutlassfuse
