// Type assembly of the sm90 fused convolutions: epilogue visitor tree, collective
// epilogue and mainloop from CUTLASS's builders, in the ping-pong kernel.
#pragma once

#include <cute/tensor.hpp>
// Before the conv builder, whose sm100 collective names cutlass::KernelHardwareInfo
// without including it.
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/thread/activation.h>

#include <type_traits>

#include "cutlassfuse/sm90/dgrad_config.h"
#include "cutlassfuse/sm90/dgrad_pingpong.cuh"
#include "cutlassfuse/sm90/group_norm_stats_visitor.cuh"

namespace cutlassfuse::sm90 {

// The tile and cluster of a configuration (dgrad_config.h) on the ping-pong kernel
// (dgrad_pingpong.cuh).
template <int TileM, int TileN, int ClusterM, int TileK = 64>
struct TileConfig {
  // The conv builders expect the K mode wrapped in its own tuple.
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::Int<TileK>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::_1, cute::_1>;
  // Epilogue subtile; its shared memory is carved out of the mainloop's stages. 64x64
  // in 16 bits, half the subtiles per tile of CUTLASS's choice (64x32); 64x32 for a
  // float32 activation, whose store buffers at 64x64 (with the statistics' 68 KB
  // staging tile) would leave the mainloop 3 stages of 32 KB, at 64x32 4. Never wider
  // than the tile.
  template <class ElementOut>
  using EpilogueTile = cute::Shape<cute::_64, cute::Int<cute::min(TileN, sizeof(ElementOut) == 4 ? 32 : 64)>>;
};

// kDescaled: the accumulators hold the products of operands scaled by powers of two
// (float32 as TF32 on float16 tensor cores, math_mode.h); the tree multiplies them by
// the call's descale factor, read from device memory (the kernel that scaled the
// filter wrote it), before the bias: fma(descale, acc, bias).
template <class Element, class TileShape, bool kDescaled_ = false>
struct FusedEpilogueTree {
  static constexpr bool kDescaled = kDescaled_;
  using Accumulator = float;
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte vectors
  template <class... Ts>
  using EVT = cutlass::epilogue::fusion::Sm90EVT<Ts...>;
  template <template <class> class Fn>
  using Compute = cutlass::epilogue::fusion::Sm90Compute<Fn, Accumulator, Accumulator, kRound>;

  // bias[channel] broadcast along the pixels; a null pointer reads as zeros, so one
  // instantiation serves layers with and without bias.
  using Bias = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, Element, Accumulator,
                                                           cute::Stride<cute::_0, cute::_1, int64_t>, kAlignment>;
  using Descale = cutlass::epilogue::fusion::Sm90ScalarBroadcast<Accumulator>;
  using BiasSum = std::conditional_t<
      kDescaled,
      EVT<Compute<cutlass::homogeneous_multiply_add>, Descale, cutlass::epilogue::fusion::Sm90AccFetch, Bias>,
      EVT<Compute<cutlass::plus>, cutlass::epilogue::fusion::Sm90AccFetch, Bias>>;
  using BiasRelu = EVT<Compute<cutlass::epilogue::thread::ReLu>, BiasSum>;
  // Root: passes ReLU(acc + bias) to the store and reduces GroupNorm partials of it.
  using Tree = EVT<Sm90GroupNormStats<Element, TileShape>, BiasRelu>;
};

// The collectives of an implicit-GEMM convolution `Op` (NDHWC operands and output)
// whose epilogue runs the visitor tree `Tree`, in the ping-pong kernel with up to
// MaxPhases phases per launch. ElementIn: input and filter (the tensor-core operands);
// ElementOut: the stored output and the tree's staging.
template <cutlass::conv::Operator Op, class ElementIn, class ElementOut, class Config_, class Tree, int MaxPhases>
struct PingpongConvKernel {
  using Config = Config_;
  using Layout = cutlass::layout::TensorNDHWC;
  using Accumulator = float;
  using TileShape = typename Config::TileShape;
  using ClusterShape = typename Config::ClusterShape;
  static constexpr int kAlignmentIn = 128 / cutlass::sizeof_bits<ElementIn>::value;  // 16-byte vectors
  static constexpr int kAlignmentOut = 128 / cutlass::sizeof_bits<ElementOut>::value;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      typename Config::template EpilogueTile<ElementOut>, Accumulator, Accumulator, void, Layout, kAlignmentOut,
      ElementOut, Layout, kAlignmentOut, cutlass::epilogue::TmaWarpSpecialized, Tree>::CollectiveOp;

  // The ping-pong kernel runs epilogues while the mainloop loads: the epilogue's shared
  // memory is carved out of the mainloop's stages.
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, ElementIn, Layout, kAlignmentIn, ElementIn, Layout,
      kAlignmentIn, Accumulator, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<pingpong_carveout_bytes<Epilogue>()>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;

  using Kernel = PingpongPhasesKernel<cutlass::conv::ConvProblemShape<Op, 3>, Mainloop, Epilogue, MaxPhases>;
  static_assert(sizeof(typename Kernel::SharedStorage) <= 227 * 1024, "shared memory over the sm90 limit");
};

// The fused deconvolution: ElementIn and ElementOut equal for float16/bfloat16 calls;
// float32 calls in bf16x3 run bfloat16 operands (three products; sm90/left_operand.h)
// with a float32 activation, in TF32 float16 operands scaled by powers of two
// (math_mode.h), descaled by the epilogue (kDescaled), with a float32 activation.
template <class ElementIn, class ElementOut, class Config, bool kDescaled = false>
struct DgradFusedKernel
    : PingpongConvKernel<cutlass::conv::Operator::kDgrad, ElementIn, ElementOut, Config,
                         typename FusedEpilogueTree<ElementOut, typename Config::TileShape, kDescaled>::Tree,
                         kMaxPhasesPerLaunch> {
  using Trees = FusedEpilogueTree<ElementOut, typename Config::TileShape, kDescaled>;
};

}  // namespace cutlassfuse::sm90
