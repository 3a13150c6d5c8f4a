// The epilogue's stride of a convolution's packed output, from CUTLASS's problem shape.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/util/packed_stride.hpp>

namespace cutlassfuse::sm90 {

// An activation output's M mode is hierarchical ((W, H, D, N), C), which
// make_cute_packed_stride does not fill: copied mode by mode from the problem's strides
// (those of a view, where the output is one). A filter output (the weight gradient,
// KTRSC) takes CUTLASS's packed stride.
template <class StrideD, class ConvShape>
StrideD output_stride(const ConvShape& shape) {
  if constexpr (cute::rank<0>(StrideD{}) > 1) {
    StrideD stride_d{};
    cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{},
                   [&](auto i) { cute::get<0, i>(stride_d) = shape.stride_C[ConvShape::RankT - 2 - i]; });
    return stride_d;
  } else {
    return cutlass::make_cute_packed_stride(StrideD{}, shape.shape_C, shape.stride_C, ConvShape::ConvOp);
  }
}

}  // namespace cutlassfuse::sm90
