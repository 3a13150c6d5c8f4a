// Type assembly, arguments and launch of the block family's sm90 fused forward
// convolution (fprop.h), expanded once per dtype by its translation unit (fprop.cu).
#pragma once

#include <cutlass/cutlass.h>

#include <string>

#include "cutlassfuse/sm90/block_activation_node.cuh"
#include "cutlassfuse/sm90/dgrad_launch.cuh"
#include "cutlassfuse/sm90/fprop.h"

namespace cutlassfuse::sm90 {

// The deconvolution's bias sum, then the block's activation (identity when it follows
// the norm), then the statistics root: act(acc + bias) is what the root stores and
// reduces.
template <class Element, class TileShape>
struct BlockEpilogueTree {
  using Base = FusedEpilogueTree<Element, TileShape>;
  using Bias = typename Base::Bias;
  using Slopes = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, float, float,
                                                             cute::Stride<cute::_0, cute::_1, int64_t>, 4>;
  using Activation = cutlass::epilogue::fusion::Sm90Compute<BlockActivation, float, float, Base::kRound>;
  using Activated = cutlass::epilogue::fusion::Sm90EVT<Activation, typename Base::BiasSum, Slopes>;
  using Tree = cutlass::epilogue::fusion::Sm90EVT<Sm90GroupNormStats<Element, TileShape>, Activated>;
};

template <class Element, class Config>
struct FpropFusedKernel
    : PingpongConvKernel<cutlass::conv::Operator::kFprop, Element, Element, Config,
                         typename BlockEpilogueTree<Element, typename Config::TileShape>::Tree, /*MaxPhases=*/1> {
  using Trees = BlockEpilogueTree<Element, typename Config::TileShape>;
};

// Conv3d in CUTLASS's user-facing terms: activation [N, D, H, W, Cin], filter
// [Cout, T, R, S, Cin], packed; CUTLASS derives the output extent (PyTorch's formula).
inline FpropShape make_fprop_shape(const Problem& p) {
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  auto triple = [&](const Extent3& e) { return FpropShape::ShapePadding{i32(e[0]), i32(e[1]), i32(e[2])}; };
  const auto& in = p.input_size;
  const auto& k = p.kernel_size;
  return FpropShape(cutlass::conv::Mode::kCrossCorrelation,
                    FpropShape::TensorExtent{i32(p.batch), i32(in[0]), i32(in[1]), i32(in[2]), i32(p.in_channels)},
                    FpropShape::TensorExtent{i32(p.out_channels), i32(k[0]), i32(k[1]), i32(k[2]), i32(p.in_channels)},
                    triple(p.padding), triple(p.padding), triple(p.stride), triple(p.dilation), /*groups=*/1);
}

template <class Fused>
typename Fused::Epilogue::FusionCallbacks::Arguments block_tree_arguments(const Problem& p, const FpropOperands& ops,
                                                                          const ActivationConstant& activation) {
  using Element = typename Fused::Epilogue::ElementD;
  const GroupNormShape gn{p.batch, p.out_channels, p.output_spatial(), p.num_groups};
  const TilePartials tiles = TilePartials::for_tiles(gn, cute::size<0>(typename Fused::TileShape{}),
                                                     cute::size<1>(typename Fused::TileShape{}));
  const GroupNormStatsArguments stats{
      ops.partials,           gn.spatial,   static_cast<int>(gn.channels / gn.num_groups), tiles.max_segments,
      tiles.max_local_groups, tiles.tiles_n};
  const typename Fused::Trees::Bias::Arguments bias{static_cast<const Element*>(ops.bias), Element(0), {}};
  const typename Fused::Trees::Slopes::Arguments slopes{ops.slopes, 0.f, {}};
  return {{{{}, bias, {}}, slopes, activation}, stats};
}

template <class Fused>
PhaseArguments<FpropShape, typename Fused::Mainloop, typename Fused::Epilogue> make_fprop_arguments(
    const Problem& problem, const FpropOperands& ops, const ActivationConstant& activation) {
  using Element = typename Fused::Epilogue::ElementD;
  using StrideD = typename Fused::Epilogue::StrideD;
  const FpropShape shape = make_fprop_shape(problem);
  const StrideD stride_d = output_stride<StrideD>(shape);
  return {shape,
          {static_cast<const Element*>(ops.input), static_cast<const Element*>(ops.filter)},
          {block_tree_arguments<Fused>(problem, ops, activation), nullptr, stride_d, static_cast<Element*>(ops.output),
           stride_d}};
}

template <class Fused>
std::string fprop_rejection(const Problem& problem) {
  if (std::string why = shape_rules_violation(problem); !why.empty()) return why;
  WelfordPartial placeholder{};
  const FpropOperands no_tensors{nullptr, nullptr, nullptr, nullptr, nullptr, &placeholder};
  const auto args = make_fprop_arguments<Fused>(problem, no_tensors, {});
  for (int i = 0; i < 3; ++i) {
    if (args.shape.shape_C[i + 1] != problem.output_size[i]) return "output extent does not match the convolution";
  }
  if (!collectives_can_implement(args))
    return "CUTLASS can_implement rejected the convolution (TMA im2col limits: padding <= 16, "
           "(kernel - 1) * dilation < 31)";
  return {};
}

template <class Fused>
void run_fprop(const Problem& problem, const FpropOperands& ops, const ActivationConstant& activation, int sm_count,
               cudaStream_t stream) {
  using Kernel = typename Fused::Kernel;
  const auto args = make_fprop_arguments<Fused>(problem, ops, activation);
  const typename Kernel::Params params =
      Kernel::to_underlying_arguments(&args, 1, /*skip_border_taps=*/false, /*counter=*/nullptr);
  const cudaError_t e = Kernel::launch(params, sm_count, stream);
  throw_on_failure(e != cudaSuccess, "fprop launch", cudaGetErrorString(e));
}

template <class Element>
using FpropKernelOf = FpropFusedKernel<Element, TileConfig<kFpropTile.m, kFpropTile.n, 1, kFpropTileK>>;

}  // namespace cutlassfuse::sm90

// Defines the kernel's two entry points for one math mode (MATH_MODE) on CUTLASS_ELEMENT.
#define CUTLASSFUSE_DEFINE_FPROP_FAMILY(MATH_MODE, CUTLASS_ELEMENT)                                      \
  namespace cutlassfuse::sm90 {                                                                          \
  template <>                                                                                            \
  std::string fprop_unsupported_reason<MATH_MODE>(const Problem& problem) {                              \
    return fprop_rejection<FpropKernelOf<CUTLASS_ELEMENT>>(problem);                                     \
  }                                                                                                      \
  template <>                                                                                            \
  void fprop_fused<MATH_MODE>(const Problem& problem, const FpropOperands& operands,                     \
                              const ActivationConstant& activation, int sm_count, cudaStream_t stream) { \
    run_fprop<FpropKernelOf<CUTLASS_ELEMENT>>(problem, operands, activation, sm_count, stream);          \
  }                                                                                                      \
  }
