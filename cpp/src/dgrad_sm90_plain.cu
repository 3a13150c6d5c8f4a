// The stock CUTLASS sm90 dgrad with a plain-store epilogue, same tile configuration as
// the fused family's default: the baseline for measuring what the fused epilogue costs.
// Like the fused family it runs one sub-pixel phase per launch.
#include "cutlassfuse/dgrad_sm90_launch.cuh"

namespace cutlassfuse::sm90 {
namespace {

template <class Element>
struct DgradPlainKernel {
  using Config = TileConfig<128, 128, 1>;
  using Layout = cutlass::layout::TensorNDHWC;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::TileShape, typename Config::ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlignment, Element, Layout,
      kAlignment, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kDgrad, Element, Layout,
      kAlignment, Element, Layout, kAlignment, float, typename Config::TileShape, typename Config::ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, Mainloop, Epilogue>;
  using Device = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
};

template <class Element>
void run_plain(const Problem& problem, const PhaseProblem& phase, const void* input, const void* filter, void* output,
               int sm_count, cudaStream_t stream) {
  using Plain = DgradPlainKernel<Element>;
  const ProblemShape shape = make_problem_shape(problem, phase);
  const auto stride_d = output_stride<typename Plain::Epilogue::StrideD>(shape);
  const PhasePointers<Element, Element> ptr(phase, input, filter, output);
  cutlass::KernelHardwareInfo hw_info;
  cudaGetDevice(&hw_info.device_id);
  hw_info.sm_count = sm_count;
  typename Plain::Device::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm, shape, {ptr.input, ptr.filter},
                                         {{}, nullptr, stride_d, ptr.output, stride_d}, hw_info};
  std::string why = shape_rules_violation(problem);
  if (why.empty()) why = phase_rejection<typename Plain::Device>(shape, phase, args);
  if (!why.empty()) throw std::invalid_argument("cutlassfuse: the plain CUTLASS dgrad cannot run this problem: " + why);
  typename Plain::Device conv;
  if (conv.initialize(args, nullptr, stream) != cutlass::Status::kSuccess || conv.run(stream) != cutlass::Status::kSuccess)
    throw std::runtime_error("cutlassfuse: the plain CUTLASS dgrad failed to run this problem");
}

}  // namespace

template <>
void dgrad_plain<ElementType::kFloat16>(const Problem& p, const PhaseProblem& phase, const void* in, const void* flt,
                                        void* out, int sms, cudaStream_t s) {
  run_plain<cutlass::half_t>(p, phase, in, flt, out, sms, s);
}

template <>
void dgrad_plain<ElementType::kBFloat16>(const Problem& p, const PhaseProblem& phase, const void* in,
                                         const void* flt, void* out, int sms, cudaStream_t s) {
  run_plain<cutlass::bfloat16_t>(p, phase, in, flt, out, sms, s);
}

}  // namespace cutlassfuse::sm90
