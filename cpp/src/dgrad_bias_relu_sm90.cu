// The sm90a tensor-core deconvolution family: ReLU(ConvTranspose3d(x, W) + bias).
// One translation unit, one tile configuration per element type (compile time is a
// feature: each CUTLASS instantiation costs about a minute of nvcc).
#include <cutlass/cutlass.h>
#include <cutlass/kernel_hardware_info.h>

#include <stdexcept>
#include <string>

#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/dgrad_sm90_kernel.cuh"

namespace cutlassfuse::sm90 {
namespace {

// 128x128x64 tiles run the KernelBench shape at 88% of the measured fp16 matmul
// ceiling on H200 (briefs/cutlass-sm90-dgrad.md); cluster 1x1 leaves TMA multicast
// off, which that measurement found no worse for this operand reuse pattern.
using DefaultConfig = TileConfig<128, 128, 64, 1, 1>;

template <class Element>
using DefaultKernel = DgradBiasReluKernel<Element, DefaultConfig>;

using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kDgrad, 3>;

// ConvTranspose3d is the dgrad of the Conv3d that maps our output y (Cout channels)
// back to our input x (Cin channels) with the same padding and dilation. The
// ConvTranspose3d output_padding extends y at the high end only, which the forward
// conv sees as a smaller upper padding.
ProblemShape make_problem_shape(const Problem& p) {
  auto i32 = [](int64_t v) { return static_cast<int>(v); };
  return ProblemShape(
      cutlass::conv::Mode::kCrossCorrelation,
      {i32(p.batch), i32(p.output_size[0]), i32(p.output_size[1]), i32(p.output_size[2]), i32(p.out_channels)},
      {i32(p.in_channels), i32(p.kernel_size[0]), i32(p.kernel_size[1]), i32(p.kernel_size[2]), i32(p.out_channels)},
      {i32(p.padding[0]), i32(p.padding[1]), i32(p.padding[2])},
      {i32(p.padding[0] - p.output_padding[0]), i32(p.padding[1] - p.output_padding[1]),
       i32(p.padding[2] - p.output_padding[2])},
      {1, 1, 1},
      {i32(p.dilation[0]), i32(p.dilation[1]), i32(p.dilation[2])},
      /*groups=*/1);
}

template <class Kernel>
typename Kernel::Device::Arguments make_arguments(const Problem& problem, const DgradOperands& ops,
                                                  int sm_count) {
  using Element = typename Kernel::Mainloop::ElementA;
  using ElementD = typename Kernel::Epilogue::ElementD;
  using StrideD = typename Kernel::Epilogue::StrideD;
  using Bias = typename Kernel::FusionOp::ElementBias;

  ProblemShape shape = make_problem_shape(problem);

  // The output's M mode is hierarchical ((W, H, D, N), C): make_cute_packed_stride
  // has no overload for it, so copy the problem's packed strides mode by mode.
  StrideD stride_d{};
  cute::for_each(cute::make_seq<cute::rank<0>(StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride_d) = shape.stride_C[ProblemShape::RankT - 2 - i];
  });

  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = sm_count;

  typename Kernel::Device::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      shape,
      {static_cast<const Element*>(ops.input), static_cast<const Element*>(ops.filter)},
      {{}, nullptr, stride_d, static_cast<ElementD*>(ops.activation), stride_d},
      hw_info};
  args.epilogue.thread.bias_ptr = static_cast<const Bias*>(ops.bias);
  return args;
}

// Rules of this kernel beyond CUTLASS's own can_implement.
std::string shape_rules_violation(const Problem& p) {
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

template <class Kernel>
std::string unsupported_reason(const Problem& problem) {
  if (std::string why = shape_rules_violation(problem); !why.empty()) return why;
  ProblemShape shape = make_problem_shape(problem);
  // The dgrad problem derives the input extents from the output's; they must agree
  // with the tensor we were given.
  for (int i = 0; i < 3; ++i) {
    if (shape.shape_A[i + 1] != problem.input_size[i])
      return "input extent does not match the dgrad problem (internal shape mismatch)";
  }
  DgradOperands dummy{nullptr, nullptr, nullptr, nullptr};
  auto args = make_arguments<Kernel>(problem, dummy, 1);
  if (Kernel::Device::can_implement(args) != cutlass::Status::kSuccess)
    return "CUTLASS can_implement rejected the problem (TMA im2col limits on padding, "
           "dilation or filter extent)";
  if (Kernel::Device::get_workspace_size(args) != 0)
    return "kernel needs a workspace";  // never for the non-persistent sm90 conv kernel
  return {};
}

template <class Kernel>
void run(const Problem& problem, const DgradOperands& ops, int sm_count, cudaStream_t stream) {
  typename Kernel::Device conv;
  auto args = make_arguments<Kernel>(problem, ops, sm_count);
  cutlass::Status status = conv.initialize(args, /*workspace=*/nullptr, stream);
  if (status != cutlass::Status::kSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: CUTLASS dgrad initialize failed: ") +
                             cutlass::cutlassGetStatusString(status));
  }
  status = conv.run(stream);
  cudaError_t launch = cudaGetLastError();
  if (status != cutlass::Status::kSuccess || launch != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: CUTLASS dgrad launch failed: ") +
                             cutlass::cutlassGetStatusString(status) + " / " +
                             cudaGetErrorString(launch));
  }
}

}  // namespace

std::string dgrad_bias_relu_unsupported_reason(ElementType element, const Problem& problem) {
  switch (element) {
    case ElementType::kFloat16: return unsupported_reason<DefaultKernel<cutlass::half_t>>(problem);
    case ElementType::kBFloat16: return unsupported_reason<DefaultKernel<cutlass::bfloat16_t>>(problem);
    default: return "dtype is not float16 or bfloat16";
  }
}

void dgrad_bias_relu(ElementType element, const Problem& problem, const DgradOperands& operands,
                     int sm_count, cudaStream_t stream) {
  switch (element) {
    case ElementType::kFloat16:
      return run<DefaultKernel<cutlass::half_t>>(problem, operands, sm_count, stream);
    case ElementType::kBFloat16:
      return run<DefaultKernel<cutlass::bfloat16_t>>(problem, operands, sm_count, stream);
    default:
      throw std::invalid_argument("cutlassfuse: the sm90 dgrad kernel takes float16 or bfloat16");
  }
}

}  // namespace cutlassfuse::sm90
