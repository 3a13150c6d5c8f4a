// The fused family's kernel layer with CUTLASS's stock epilogue (a plain store, no
// bias, ReLU or statistics): the baseline for measuring what the fused epilogue costs.
// 128x128 tiles on the ping-pong kernel, in clusters of one or two CTAs.
#include "cutlassfuse/sm90/dgrad_launch.cuh"

namespace cutlassfuse::sm90 {
namespace {

template <class Element, class Config>
struct DgradPlainKernel {
  using Layout = cutlass::layout::TensorNDHWC;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::TileShape, typename Config::ClusterShape,
      typename Config::template EpilogueTile<Element>, float, float, void, Layout, kAlignment, Element, Layout,
      kAlignment, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
  using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kDgrad, Element, Layout, kAlignment,
      Element, Layout, kAlignment, float, typename Config::TileShape, typename Config::ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<pingpong_carveout_bytes<Epilogue>()>,
      cutlass::conv::collective::KernelScheduleAuto>::CollectiveOp;
  using Kernel = PingpongPhasesKernel<DgradShape, Mainloop, Epilogue, kMaxPhasesPerLaunch>;
};

template <class Element, class Config>
void run_plain(const Problem& problem, std::span<const PhaseLaunch> phases, const ScheduleOptions& schedule,
               int sm_count, cudaStream_t stream) {
  using Plain = DgradPlainKernel<Element, Config>;
  auto reject = [](const std::string& why) {
    throw std::invalid_argument("cutlassfuse: the plain CUTLASS dgrad cannot run this problem: " + why);
  };
  if (std::string why = shape_rules_violation(problem); !why.empty()) reject(why);
  std::vector<PhaseArguments<DgradShape, typename Plain::Mainloop, typename Plain::Epilogue>> args;
  for (const PhaseLaunch& launch : phases) {
    const DgradShape shape = make_problem_shape(problem, *launch.phase);
    const auto stride_d = output_stride<typename Plain::Epilogue::StrideD>(shape);
    const PhasePointers<Element, Element> ptr(*launch.phase, launch.operands.input, launch.operands.filter,
                                              launch.operands.activation);
    args.push_back({shape, {ptr.input, ptr.filter}, {{}, nullptr, stride_d, ptr.output, stride_d}});
    if (std::string why = phase_rejection(*launch.phase, args.back()); !why.empty()) reject(why);
  }
  using Kernel = typename Plain::Kernel;
  launch_pingpong<Kernel>(pingpong_launch_params<Kernel>(args, phases.front().operands.unit_counter, schedule),
                          sm_count, stream);
}

template <class Element>
void run_plain_config(DgradConfig config, const Problem& problem, std::span<const PhaseLaunch> phases,
                      const ScheduleOptions& schedule, int sm_count, cudaStream_t stream) {
  auto run = [&](auto tiles) { run_plain<Element, decltype(tiles)>(problem, phases, schedule, sm_count, stream); };
  if (cluster_size(config) == 2) return run(TileConfig<128, 128, 2>{});
  run(TileConfig<128, 128, 1>{});
}

}  // namespace

template <>
void dgrad_plain<MathMode::kFloat16>(DgradConfig config, const Problem& p, std::span<const PhaseLaunch> phases,
                                     const ScheduleOptions& schedule, int sms, cudaStream_t s) {
  run_plain_config<cutlass::half_t>(config, p, phases, schedule, sms, s);
}

template <>
void dgrad_plain<MathMode::kBFloat16>(DgradConfig config, const Problem& p, std::span<const PhaseLaunch> phases,
                                      const ScheduleOptions& schedule, int sms, cudaStream_t s) {
  run_plain_config<cutlass::bfloat16_t>(config, p, phases, schedule, sms, s);
}

}  // namespace cutlassfuse::sm90
