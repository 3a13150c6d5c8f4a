// Argument checks the operators share (validation.cpp), each raising PyTorch's error
// kind with a message naming the argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <optional>

#include "cutlassfuse/block.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// Three values (depth, height, width), ValueError otherwise.
Extent3 to_extent3(at::IntArrayRef values, const char* name);

// RuntimeError, as PyTorch's operands on different devices, unless `t` is on the
// input's device.
void check_same_device(const at::Tensor& input, const char* name, const at::Tensor& t);

// When present: 1-D of `size` floating values, of the input's dtype if `same_dtype`.
void check_optional_vector(const std::optional<at::Tensor>& t, const char* name, int64_t size, const at::Tensor& input,
                           bool same_dtype);

// Whether an output of these (exact, positive) sizes fits PyTorch's bound on a tensor's
// storage, 2^63 - 1 bytes, with at least one sample.
bool output_fits(int64_t batch, int64_t channels, const std::array<__int128, 3>& spatial, int64_t element_size);

// Checks the convolution (PyTorch's rules for nn.Conv3d, or nn.ConvTranspose3d when
// transposed) and resolves its sizes: Problem without the norm's fields.
Problem validate_convolution(const ConvolutionArgs& args);

}  // namespace cutlassfuse
