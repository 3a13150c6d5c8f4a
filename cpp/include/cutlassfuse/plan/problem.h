// The problem cutlassfuse solves, with every size resolved:
//
//     out = GroupNorm(ReLU(ConvTranspose3d(input)))
//
// and, for the block family (block.h), a convolution of either kind with its norm: then
// input_size, kernel_size and output_size are the convolution's, and in/out_channels
// its input's and output's channels.
// Plain C++ (no torch, no CUDA) so host dispatch code and kernel translation units
// share one description.
#pragma once

#include <array>
#include <cstdint>
#include <type_traits>

namespace cutlassfuse {

// One value per spatial dimension, ordered (depth, height, width) as in PyTorch.
using Extent3 = std::array<int64_t, 3>;

struct Problem {
  int64_t batch = 0;
  int64_t in_channels = 0;
  int64_t out_channels = 0;
  Extent3 input_size{};   // D, H, W of the ConvTranspose3d input
  Extent3 kernel_size{};  // T, R, S
  Extent3 output_size{};  // Do, Ho, Wo
  Extent3 stride{};
  Extent3 padding{};
  Extent3 output_padding{};
  Extent3 dilation{};
  int64_t conv_groups = 1;
  int64_t num_groups = 1;  // GroupNorm groups over out_channels
  double eps = 1e-5;

  bool operator==(const Problem&) const = default;

  int64_t output_spatial() const { return output_size[0] * output_size[1] * output_size[2]; }
  int64_t input_spatial() const { return input_size[0] * input_size[1] * input_size[2]; }
  int64_t output_numel() const { return batch * out_channels * output_spatial(); }
  int64_t input_numel() const { return batch * in_channels * input_spatial(); }
};

// ConvTranspose3d's output extent along one dimension (PyTorch's formula), computed in
// Int: int64_t, or a wider type where the sizes are not yet known to fit (validation).
template <class Int = int64_t>
constexpr Int transposed_conv_output_extent(std::type_identity_t<Int> input, std::type_identity_t<Int> kernel,
                                            std::type_identity_t<Int> stride, std::type_identity_t<Int> padding,
                                            std::type_identity_t<Int> output_padding,
                                            std::type_identity_t<Int> dilation) {
  return (input - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1;
}

// Conv3d's output extent along one dimension (PyTorch's formula), in Int as above; zero
// or less when the dilated kernel does not fit the padded input.
template <class Int = int64_t>
constexpr Int conv_output_extent(std::type_identity_t<Int> input, std::type_identity_t<Int> kernel,
                                 std::type_identity_t<Int> stride, std::type_identity_t<Int> padding,
                                 std::type_identity_t<Int> dilation) {
  const Int span = input + 2 * padding - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Element types the CUDA kernels are written for.
enum class ElementType { kFloat32, kFloat16, kBFloat16 };

}  // namespace cutlassfuse
