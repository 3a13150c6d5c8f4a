// Type assembly and launch of the conv-gradient kernels (conv_gradients.h): CUTLASS's
// builders for the mainloop (fprop or wgrad, im2col TMA with the layer's stride) and a
// plain-store epilogue, in CUTLASS's non-persistent kernel layer.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/kernel_hardware_info.hpp>
#include <cutlass/conv/collective/collective_builder.hpp>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/device/conv_universal_adapter.hpp>
#include <cutlass/conv/kernel/conv_universal.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cutlassfuse/plan/problem.h"
#include "cutlassfuse/sm90/conv_output_stride.cuh"

namespace cutlassfuse::sm90 {

template <cutlass::conv::Operator Op, class Element>
struct ConvGradientKernel {
  static constexpr bool kWeightGradient = Op == cutlass::conv::Operator::kWgrad;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte vectors
  // 128x128 output tiles, 64 deep; wgrad's N mode (the filter's taps and channels) and
  // every conv K mode are hierarchical, hence the nested shapes.
  using TileShape =
      std::conditional_t<kWeightGradient, cute::Shape<cute::_128, cute::Shape<cute::_128>, cute::Shape<cute::_64>>,
                         cute::Shape<cute::_128, cute::_128, cute::Shape<cute::_64>>>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  // The weight gradient is a filter, [K, T, R, S, C]; the input gradient an activation.
  using OutputLayout = std::conditional_t<kWeightGradient, cutlass::layout::TensorKCSRT, cutlass::layout::TensorNDHWC>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, OutputLayout, kAlignment, Element,
      OutputLayout, kAlignment, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Op, Element, cutlass::layout::TensorNDHWC, kAlignment,
      Element, cutlass::layout::TensorNDHWC, kAlignment, float, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
  using ProblemShape = cutlass::conv::ConvProblemShape<Op, 3>;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>;
  using Device = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

// The forward convolution whose gradients these are, in CUTLASS's user-facing terms:
// activation dz [N, O, Cout], filter [Cin, T, R, S, Cout], padding (p, max(0, p - op)).
template <class ProblemShape>
ProblemShape conv_gradient_problem_shape(const Problem& p) {
  using Extent = typename ProblemShape::TensorExtent;
  using Spatial = typename ProblemShape::ShapePadding;
  Extent activation{static_cast<int>(p.batch), 0, 0, 0, static_cast<int>(p.out_channels)};
  Extent filter{static_cast<int>(p.in_channels), 0, 0, 0, static_cast<int>(p.out_channels)};
  Spatial lower{}, upper{}, stride{}, dilation{};
  for (int i = 0; i < 3; ++i) {
    activation[i + 1] = static_cast<int>(p.output_size[i]);
    filter[i + 1] = static_cast<int>(p.kernel_size[i]);
    lower[i] = static_cast<int>(p.padding[i]);
    upper[i] = static_cast<int>(std::max<int64_t>(0, p.padding[i] - p.output_padding[i]));
    stride[i] = static_cast<int>(p.stride[i]);
    dilation[i] = static_cast<int>(p.dilation[i]);
  }
  return ProblemShape(cutlass::conv::Mode::kCrossCorrelation, activation, filter, lower, upper, stride, dilation,
                      /*groups=*/1);
}

inline void throw_conv_gradient_failure(const char* what, cutlass::Status status) {
  throw std::runtime_error(std::string("cutlassfuse: the conv-gradient kernel failed to ") + what + ": " +
                           cutlass::cutlassGetStatusString(status));
}

// A: the mainloop's first operand, B: its second (fprop: dz, filter; wgrad: x, dz).
template <cutlass::conv::Operator Op, class Element>
void run_conv_gradient(const Problem& problem, const void* a, const void* b, void* out, int sm_count,
                       cudaStream_t stream) {
  using Gradient = ConvGradientKernel<Op, Element>;
  using Device = typename Gradient::Device;
  using ProblemShape = typename Gradient::ProblemShape;
  const ProblemShape shape = conv_gradient_problem_shape<ProblemShape>(problem);
  const auto stride_d = output_stride<typename Gradient::Epilogue::StrideD>(shape);
  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = sm_count;
  const typename Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                        shape,
                                        {static_cast<const Element*>(a), static_cast<const Element*>(b)},
                                        {{}, nullptr, stride_d, static_cast<Element*>(out), stride_d},
                                        hw_info};
  Device conv;
  cutlass::Status status = conv.can_implement(args);
  if (status != cutlass::Status::kSuccess) throw_conv_gradient_failure("take the problem", status);
  if (Device::get_workspace_size(args) != 0) {
    throw std::runtime_error("cutlassfuse: the conv-gradient kernel asks for a workspace");
  }
  status = conv.initialize(args, /*workspace=*/nullptr, stream);
  if (status != cutlass::Status::kSuccess) throw_conv_gradient_failure("initialize", status);
  status = conv.run(stream);
  if (status != cutlass::Status::kSuccess) throw_conv_gradient_failure("launch", status);
}

}  // namespace cutlassfuse::sm90
