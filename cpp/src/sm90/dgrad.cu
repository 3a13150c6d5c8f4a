// The fused deconvolution's CUTLASS kernels (sm90/dgrad.h): the dgrad family in its four
// math modes, every tile configuration of each; the pixel-shuffle GEMM, which runs kernel ==
// stride layers on NCDHW input in the same ping-pong kernel with the same epilogue; and the
// host's view of the ping-pong kernel's border-tap rule.
//
// One translation unit for these fourteen kernels: they differ in element types, tile shapes
// and operand layouts only, so most of the template instantiations that make up cicc's time
// are common to them, and one compile makes them once (docs/architecture.md, "The build").
#include <cutlass/gemm/collective/collective_builder.hpp>

#include "cutlassfuse/sm90/dgrad_launch.cuh"

// float16 and bfloat16 calls: operands and activation in the call's dtype.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat16, cutlass::half_t, cutlass::half_t)
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kBFloat16, cutlass::bfloat16_t, cutlass::bfloat16_t)
// float32 calls at TF32's precision: float16 operands holding the input and filter
// scaled by powers of two and rounded to nearest (common/tf32_scaling.h), float32
// accumulation, descaled in the epilogue, a float32 activation.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsTf32, cutlass::half_t, float)
// float32 calls: bfloat16 operands holding the input and filter split into pieces (three
// products; float32_split.h), float32 accumulation, a float32 activation.
CUTLASSFUSE_DEFINE_DGRAD_FAMILY(cutlassfuse::MathMode::kFloat32AsBf16x3, cutlass::bfloat16_t, float)

namespace cutlassfuse::sm90 {

// Whether a phase's tiles skip depth taps (tap_window.h), as the ping-pong kernel decides
// it, so that a call's plan can report it.
bool phase_skips_border_taps(const Problem& problem, const PhaseProblem& phase, const ScheduleOptions& schedule) {
  if (!schedule.skip_border_taps) return false;
  // K blocks of 64 channels at each filter tap, as the kernels' TileShape tiles K.
  constexpr int kTileK = 64;
  constexpr int kTileM = 128;
  const Extent3& taps = phase.filter.extent;
  const auto k_tiles = static_cast<int>(ceil_div(problem.in_channels, kTileK) * taps[0] * taps[1] * taps[2]);
  const TapWindow window =
      GemmExtents<DgradShape>::taps(make_problem_shape(problem, phase), k_tiles, kTileM, /*skip_border_taps=*/true);
  return !window.every_tap;
}

namespace {

// The pixel-shuffle GEMM reading an NCDHW input as it is: batched over the samples
// (L), each sample's [pixels, Cin] left operand M-major (its channels are planes of
// pixels; TMA and wgmma take 16-bit operands transposed at full rate), times the packed
// filter [Cin, blocks * Cout] (N-major, shared by the samples), into the space-to-depth
// activation [samples, pixels, blocks * Cout]. The conv collectives read NDHWC only, so
// this is CUTLASS's GEMM mainloop in the same ping-pong kernel with the same epilogue:
// no transpose pass over the input. 128x128 tiles only (the path serves kernel ==
// stride layers, whose blocks * Cout columns fill them).
template <class Element>
struct PixelMajorGemmKernel {
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Trees = FusedEpilogueTree<Element, TileShape>;
  static constexpr int kAlignment = Trees::kAlignment;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape, cute::Shape<cute::_64, cute::_128>,
      float, float, void, cutlass::layout::RowMajor, kAlignment, Element, cutlass::layout::RowMajor, kAlignment,
      cutlass::epilogue::TmaWarpSpecialized, typename Trees::Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cutlass::layout::ColumnMajor, kAlignment, Element,
      cutlass::layout::RowMajor, kAlignment, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<pingpong_carveout_bytes<Epilogue>()>,
      cutlass::gemm::KernelTmaWarpSpecializedPingpong>::CollectiveOp;
  using Kernel = PingpongPhasesKernel<BatchedGemmShape, Mainloop, Epilogue, /*MaxPhases=*/1>;
  static_assert(cute::size<0>(TileShape{}) == kPixelMajorGemmTile.m &&
                cute::size<1>(TileShape{}) == kPixelMajorGemmTile.n);
  static_assert(sizeof(typename Kernel::SharedStorage) <= 227 * 1024, "shared memory over the sm90 limit");
};

// Per sample l: A(m, k, l) = input[l, k, m] (pixels m of channel plane k), B(n, k) =
// filter[k, n] for every sample, D(m, n, l) = activation[l, m, n].
template <class Gemm>
PhaseArguments<BatchedGemmShape, typename Gemm::Mainloop, typename Gemm::Epilogue> make_gemm_arguments(
    const Problem& gemm, const DgradOperands& ops) {
  using Element = typename Gemm::Mainloop::ElementA;
  const int64_t pixels = gemm.input_spatial();
  const int64_t columns = gemm.out_channels;
  const int64_t channels = gemm.in_channels;
  const BatchedGemmShape shape{static_cast<int>(pixels), static_cast<int>(columns), static_cast<int>(channels),
                               static_cast<int>(gemm.batch)};
  const typename Gemm::Mainloop::StrideA stride_a{cute::_1{}, pixels, channels * pixels};
  const typename Gemm::Mainloop::StrideB stride_b{cute::_1{}, columns, int64_t{0}};
  const typename Gemm::Epilogue::StrideD stride_d{columns, cute::_1{}, pixels * columns};
  GroupNormShape statistics{gemm.batch, gemm.out_channels, pixel_major_statistics_rows(pixels), gemm.num_groups};
  auto* activation = static_cast<Element*>(ops.activation);
  return {shape,
          {static_cast<const Element*>(ops.input), stride_a, static_cast<const Element*>(ops.filter), stride_b},
          {tree_arguments<Gemm>(statistics, ops), nullptr, stride_d, activation, stride_d}};
}

template <class Element>
std::string gemm_unsupported_reason(const Problem& gemm) {
  if (std::string why = shape_rules_violation(gemm); !why.empty()) return why;
  WelfordPartial placeholder{};
  const DgradOperands no_tensors{nullptr, nullptr, nullptr, nullptr, &placeholder};
  if (!collectives_can_implement(make_gemm_arguments<PixelMajorGemmKernel<Element>>(gemm, no_tensors)))
    return "CUTLASS can_implement rejected the pixel-major GEMM (TMA: pixels per sample a multiple of 8)";
  return {};
}

template <class Element>
void run_gemm(const Problem& gemm, const DgradOperands& ops, int sm_count, cudaStream_t stream) {
  using Kernel = typename PixelMajorGemmKernel<Element>::Kernel;
  const auto args = make_gemm_arguments<PixelMajorGemmKernel<Element>>(gemm, ops);
  // One phase of uniform tiles, no border taps: the static walk balances them.
  launch_pingpong<Kernel>({Kernel::to_underlying_arguments(&args, 1, /*skip_border_taps=*/false, /*counter=*/nullptr)},
                          sm_count, stream);
}

}  // namespace

template <>
std::string pixel_major_gemm_unsupported_reason<MathMode::kFloat16>(const Problem& gemm) {
  return gemm_unsupported_reason<cutlass::half_t>(gemm);
}
template <>
std::string pixel_major_gemm_unsupported_reason<MathMode::kBFloat16>(const Problem& gemm) {
  return gemm_unsupported_reason<cutlass::bfloat16_t>(gemm);
}
template <>
void pixel_major_gemm_fused<MathMode::kFloat16>(const Problem& gemm, const DgradOperands& ops, int sm_count,
                                                cudaStream_t stream) {
  run_gemm<cutlass::half_t>(gemm, ops, sm_count, stream);
}
template <>
void pixel_major_gemm_fused<MathMode::kBFloat16>(const Problem& gemm, const DgradOperands& ops, int sm_count,
                                                 cudaStream_t stream) {
  run_gemm<cutlass::bfloat16_t>(gemm, ops, sm_count, stream);
}

}  // namespace cutlassfuse::sm90
