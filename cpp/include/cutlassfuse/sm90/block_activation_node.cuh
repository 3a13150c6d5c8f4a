// The block family's activation as an sm90 epilogue compute function: the kind is a
// runtime argument, so one kernel instantiation serves every activation of
// plan/activation.h (the definitions the other kernels and the backward read).
//
// Use: Sm90Compute<BlockActivation, ElementOut, float, round> over two children, the
// value (acc + bias) and PReLU's slope of each column (a row broadcast of float32
// slopes, one per output channel; a null pointer reads zeros for the other kinds).
// Sm90Compute converts both to float and passes the node's Arguments last.
//
// Assumptions: the kind is the same for every element of a launch, so each fragment
// costs one branch on it (with_activation_kind) and its loop is compiled per kind; the
// slopes child is per column (channel), which is all PReLU needs.
#pragma once

#include <cutlass/array.h>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/plan/activation.h"

namespace cutlassfuse::sm90 {

template <class T>
struct BlockActivation {
  using Arguments = ActivationConstant;
};

template <int N>
struct BlockActivation<cutlass::Array<float, N>> {
  using Arguments = ActivationConstant;

  CUTLASS_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& value,
                                                     cutlass::Array<float, N> const& slope,
                                                     Arguments const& args) const {
    float v[N];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) v[i] = value[i];
    with_activation_kind(args.kind, [&](auto known) {
      constexpr ActivationKind kKind = decltype(known)::value;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < N; ++i)
        v[i] = activate(kKind, v[i], kKind == ActivationKind::kPReLU ? slope[i] : args.parameter);
    });
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = v[i];
    return out;
  }
};

}  // namespace cutlassfuse::sm90
