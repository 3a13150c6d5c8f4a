// Arguments, checks and launch of the sm90 fused dgrad family, shared by the per-dtype
// translation units (dgrad_sm90_f16.cu, dgrad_sm90_bf16.cu).
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.h>

#include <stdexcept>
#include <string>

#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/dgrad_sm90_kernel.cuh"

namespace cutlassfuse::sm90 {

using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kDgrad, 3>;

// ConvTranspose3d is the dgrad of the Conv3d that maps our output y (Cout channels)
// back to our input x (Cin channels) with the same padding and dilation. The
// ConvTranspose3d output_padding extends y at the high end only, which the forward
// conv sees as a smaller upper padding.
inline ProblemShape make_problem_shape(const Problem& p) {
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  return ProblemShape(
      cutlass::conv::Mode::kCrossCorrelation,
      {i32(p.batch), i32(p.output_size[0]), i32(p.output_size[1]), i32(p.output_size[2]), i32(p.out_channels)},
      {i32(p.in_channels), i32(p.kernel_size[0]), i32(p.kernel_size[1]), i32(p.kernel_size[2]), i32(p.out_channels)},
      {i32(p.padding[0]), i32(p.padding[1]), i32(p.padding[2])},
      {i32(p.padding[0] - p.output_padding[0]), i32(p.padding[1] - p.output_padding[1]),
       i32(p.padding[2] - p.output_padding[2])},
      {1, 1, 1}, {i32(p.dilation[0]), i32(p.dilation[1]), i32(p.dilation[2])}, /*groups=*/1);
}

// The output's M mode is hierarchical ((W, H, D, N), C): make_cute_packed_stride has no
// overload for it, so copy the problem's packed strides mode by mode.
template <class StrideD>
StrideD output_stride(const ProblemShape& shape) {
  StrideD stride_d{};
  cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = shape.stride_C[ProblemShape::RankT - 2 - i];
  });
  return stride_d;
}

inline GroupNormShape group_norm_shape(const Problem& p) {
  return {p.batch, p.out_channels, p.output_spatial(), p.num_groups};
}

template <class Fused>
typename Fused::Device::Arguments make_arguments(const Problem& problem, const DgradOperands& ops, int sm_count) {
  using Element = typename Fused::Mainloop::ElementA;
  using ElementD = typename Fused::Epilogue::ElementD;
  using StrideD = typename Fused::Epilogue::StrideD;
  constexpr int kTileM = cute::size<0>(typename Fused::TileShape{});
  constexpr int kTileN = cute::size<1>(typename Fused::TileShape{});

  const ProblemShape shape = make_problem_shape(problem);
  const StrideD stride_d = output_stride<StrideD>(shape);

  const GroupNormShape gn = group_norm_shape(problem);
  const TilePartials tiles = TilePartials::for_tiles(gn, kTileM, kTileN);
  const GroupNormStatsArguments stats{ops.partials, gn.spatial, static_cast<int>(gn.channels / gn.num_groups),
                                      tiles.max_segments, tiles.max_local_groups, tiles.tiles_n};
  // Tree arguments nest as the tree: {child arguments..., node arguments}.
  const typename Fused::Trees::Bias::Arguments bias{static_cast<const Element*>(ops.bias), Element(0), {}};
  const typename Fused::Epilogue::FusionCallbacks::Arguments tree{{{{}, bias, {}}, {}}, stats};

  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = sm_count;
  return {cutlass::gemm::GemmUniversalMode::kGemm,
          shape,
          {static_cast<const Element*>(ops.input), static_cast<const Element*>(ops.filter)},
          {tree, nullptr, stride_d, static_cast<ElementD*>(ops.activation), stride_d},
          hw_info};
}

// Rules of this kernel beyond CUTLASS's own can_implement.
inline std::string shape_rules_violation(const Problem& p) {
  for (int i = 0; i < 3; ++i) {
    if (p.stride[i] != 1) return "stride > 1 (needs the sub-pixel phase decomposition)";
    if (p.output_padding[i] > p.padding[i]) return "output_padding larger than padding";
  }
  if (p.conv_groups != 1) return "grouped convolution";
  if (p.in_channels % 8 != 0 || p.out_channels % 8 != 0)
    return "channel counts not multiples of 8 (TMA needs 16-byte aligned channel rows)";
  // CUTLASS's conv problem shape and TMA descriptors take 32-bit extents.
  constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;
  if (p.output_numel() > kMax32 || p.input_numel() > kMax32) return "more than 2^31 elements";
  return {};
}

template <class Fused>
std::string unsupported_reason(const Problem& problem) {
  if (std::string why = shape_rules_violation(problem); !why.empty()) return why;
  const ProblemShape shape = make_problem_shape(problem);
  // The dgrad problem derives the input extents from the output's; they must agree
  // with the tensor we were given.
  for (int i = 0; i < 3; ++i) {
    if (shape.shape_A[i + 1] != problem.input_size[i]) return "input extent does not match the dgrad problem";
  }
  WelfordPartial placeholder{};
  auto args = make_arguments<Fused>(problem, {nullptr, nullptr, nullptr, nullptr, &placeholder}, 1);
  if (Fused::Device::can_implement(args) != cutlass::Status::kSuccess)
    return "CUTLASS can_implement rejected the problem (TMA im2col limits on padding, dilation or filter extent)";
  if (Fused::Device::get_workspace_size(args) != 0) return "kernel needs a workspace";  // never for sm90 conv
  return {};
}

template <class Fused>
void run(const Problem& problem, const DgradOperands& ops, int sm_count, cudaStream_t stream) {
  typename Fused::Device conv;
  auto args = make_arguments<Fused>(problem, ops, sm_count);
  cutlass::Status status = conv.initialize(args, /*workspace=*/nullptr, stream);
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: CUTLASS dgrad initialize failed: ") +
                             cutlass::cutlassGetStatusString(status));
  }
  status = conv.run(stream);
  const cudaError_t launch = cudaGetLastError();
  if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: CUTLASS dgrad launch failed: ") +
                             cutlass::cutlassGetStatusString(status) + " / " + cudaGetErrorString(launch));
  }
}

// One configuration enum value -> one kernel type.
template <class Element, class F>
decltype(auto) with_kernel(DgradConfig config, F&& f) {
  switch (config) {
    case DgradConfig::k128x128_cluster2x1: return f(DgradFusedKernel<Element, TileConfig<128, 128, 2>>{});
    case DgradConfig::k128x64_cluster1x1: return f(DgradFusedKernel<Element, TileConfig<128, 64, 1>>{});
    default: return f(DgradFusedKernel<Element, TileConfig<128, 128, 1>>{});
  }
}

}  // namespace cutlassfuse::sm90

// Defines the family's two entry points for one element type.
#define CUTLASSFUSE_DEFINE_DGRAD_FAMILY(ELEMENT_TYPE, CUTLASS_ELEMENT)                                         \
  namespace cutlassfuse::sm90 {                                                                                 \
  template <>                                                                                                   \
  std::string dgrad_unsupported_reason<ELEMENT_TYPE>(DgradConfig config, const Problem& problem) {              \
    return with_kernel<CUTLASS_ELEMENT>(config, [&](auto fused) { return unsupported_reason<decltype(fused)>(problem); }); \
  }                                                                                                             \
  template <>                                                                                                   \
  void dgrad_fused<ELEMENT_TYPE>(DgradConfig config, const Problem& problem, const DgradOperands& operands,     \
                                 int sm_count, cudaStream_t stream) {                                          \
    with_kernel<CUTLASS_ELEMENT>(config, [&](auto fused) { run<decltype(fused)>(problem, operands, sm_count, stream); }); \
  }                                                                                                             \
  }
