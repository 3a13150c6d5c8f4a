// A persistent ping-pong kernel for CUTLASS's sm90 collectives (the implicit-GEMM
// dgrad's, the block family's implicit-GEMM fprop, or the batched GEMM's of the
// pixel-shuffle path), running the output tiles of several sub-pixel phases in one
// launch.
//
// Why it exists: CUTLASS's sm90 conv kernel is non-persistent with one consumer
// warpgroup (its dispatch policy rejects the persistent schedules), so every tile's
// epilogue (here: bias, ReLU, store and the GroupNorm statistics reduction) runs while
// the tensor cores idle, and each sub-pixel phase is its own launch with its own
// partial last wave. This kernel keeps CUTLASS's mainloop and epilogue collectives and
// replaces the kernel layer around them:
//   - one CTA per SM takes tiles (PhaseTiles' units) of a list, phase after phase: its
//     first two statically, the rest drawn from a counter as its producer reaches them,
//     so that CTAs whose tiles skip more K blocks take more (unit_schedule.cuh); in a
//     cluster of CTAs along M, the CTAs walk the list statically in step, one tile each
//     per unit, and each loads a slice of the shared filter tile, multicast to all;
//   - warpgroup 0 is the producer: its first warp issues the TMA loads of every tile
//     into one shared-memory pipeline, running ahead across tile and phase boundaries;
//   - warpgroups 1 and 2 are consumers taking alternate tiles. An ordered barrier lets
//     one run its MMAs while the other runs its epilogue, so the epilogue is hidden
//     behind tensor-core work instead of serialized after it.
// Each phase has its own TMA descriptors and epilogue parameters (output view, bias,
// partials region) in the kernel's parameters. A batched GEMM is one phase whose tiles
// run over the batch too.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/conv/convnd_problem_shape.hpp>
#include <cutlass/conv/detail.hpp>
#include <cutlass/device_kernel.h>
#include <cutlass/fast_math.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "cutlassfuse/sm90/tap_window.h"
#include "cutlassfuse/sm90/unit_schedule.cuh"

namespace cutlassfuse::sm90 {

// The work of one launch, in units of one cluster's tiles: ClusterM M-adjacent tiles of
// one N tile (the cluster's CTAs share, through TMA multicast, the filter tile they all
// read). Phase p owns units [first_unit[p], first_unit[p + 1]), numbered with the N
// units of an M unit adjacent (they share their input rows in L2), then M units, then
// batch entries (L; 1 for a convolution). When ClusterM does not divide a phase's M
// tiles, its last M unit has tiles past the problem: their CTAs run the mainloop (the
// multicast needs both CTAs' loads) and skip the epilogue. A unit's K blocks are those
// of the depth taps reaching any of its pixels (tap_window.h): the same for the
// cluster's CTAs, which load each K block's filter tile together.
template <int MaxPhases, int ClusterM, int TileM>
struct PhaseTiles {
  // Divisors as FastDivmod (a multiply and a shift): the producer warp locates every
  // tile before its loads, on few registers (kProducerRegisters).
  int phases = 0;
  int tiles_m[MaxPhases] = {};
  cutlass::FastDivmod tiles_n[MaxPhases] = {};
  cutlass::FastDivmod units_mn[MaxPhases] = {};
  TapWindow taps[MaxPhases] = {};
  int first_unit[MaxPhases + 1] = {};

  void append_phase(int m_tiles, int n_tiles, int batch, TapWindow const& window) {
    const int units = (m_tiles + ClusterM - 1) / ClusterM * n_tiles;
    tiles_m[phases] = m_tiles;
    tiles_n[phases] = cutlass::FastDivmod(n_tiles);
    units_mn[phases] = cutlass::FastDivmod(units);
    taps[phases] = window;
    first_unit[phases + 1] = first_unit[phases] + units * batch;
    ++phases;
  }

  CUTLASS_HOST_DEVICE int total() const { return first_unit[phases]; }

  struct Work {
    int phase;
    int unit_m;  // the unit's first M tile
    int m;
    int n;
    int l;
    bool in_problem;  // false: a tile past the problem's M extent (see above)
  };
  // The tile of `unit` that the CTA of rank `rank_in_cluster` computes.
  CUTLASS_DEVICE Work locate(int unit, int rank_in_cluster) const {
    int phase = 0;
    while (unit >= first_unit[phase + 1]) ++phase;
    int l, mn, unit_m, n;
    units_mn[phase](l, mn, unit - first_unit[phase]);
    tiles_n[phase](unit_m, n, mn);
    unit_m *= ClusterM;
    const int m = unit_m + rank_in_cluster;
    return {phase, unit_m, m, n, l, m < tiles_m[phase]};
  }
  // The depth taps of a unit's tiles, and their number of K blocks.
  CUTLASS_DEVICE TapRange k_blocks(Work const& work) const {
    const TapWindow& window = taps[work.phase];
    const int first_pixel = work.unit_m * TileM;
    const int last_pixel = cute::min((work.unit_m + ClusterM) * TileM, window.pixels) - 1;
    return TapRange::reaching(window, first_pixel, last_pixel);
  }
  // 0 past the last unit.
  CUTLASS_DEVICE int k_tiles_of(int unit) const { return unit < total() ? k_blocks(locate(unit, 0)).k_tiles : 0; }
};

using DgradShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kDgrad, 3>;
using FpropShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop, 3>;
using BatchedGemmShape = cute::Shape<int, int, int, int>;  // (M, N, K, L)

// A problem's GEMM extents (M, N, K, L) as the collectives see them. A convolution's
// come from CUTLASS's conv helpers (ConvGemmExtents); a batched GEMM's are the shape
// itself.
// The depth taps of its K blocks (tap_window.h): a GEMM's K has none, every K block runs.
template <class ProblemShape>
struct GemmExtents {
  template <class CollectiveMainloop>
  static BatchedGemmShape mainloop(ProblemShape const& shape) {
    return shape;
  }
  static BatchedGemmShape epilogue(ProblemShape const& shape) { return shape; }
  static TapWindow taps(ProblemShape const&, int k_tiles, int /*tile_m*/, bool /*skip_border_taps*/) {
    TapWindow every_block;
    every_block.blocks_per_tap = k_tiles;
    return every_block;
  }
  template <class KBlockShape>
  CUTLASS_DEVICE static auto k_block_iterator(KBlockShape const& k_blocks, TapRange) {
    return cute::make_coord_iterator(k_blocks);
  }
};

// A convolution's extents from CUTLASS's conv helpers: the mainloop's M linear over the
// output pixels, the epilogue's hierarchical ((w, h, d, n)).
template <class ConvShape>
struct ConvGemmExtents {
  template <class CollectiveMainloop>
  static auto mainloop(ConvShape const& shape) {
    return cute::append<4>(CollectiveMainloop::get_problem_shape_MNKL(shape), cute::Int<1>{});
  }
  static auto epilogue(ConvShape const& shape) {
    return cutlass::conv::detail::get_transformed_problem_shape_MNKL(shape);
  }
};

// A forward convolution (Conv3d) runs every K block of every tile.
template <>
struct GemmExtents<FpropShape> : ConvGemmExtents<FpropShape> {
  static TapWindow taps(FpropShape const& shape, int k_tiles, int tile_m, bool skip_border_taps) {
    return GemmExtents<BatchedGemmShape>::taps(BatchedGemmShape{}, k_tiles, tile_m, skip_border_taps);
  }
  template <class KBlockShape>
  CUTLASS_DEVICE static auto k_block_iterator(KBlockShape const& k_blocks, TapRange) {
    return cute::make_coord_iterator(k_blocks);
  }
};

template <>
struct GemmExtents<DgradShape> : ConvGemmExtents<DgradShape> {
  // CUTLASS's shapes are (n, d, h, w, c) and its per-dimension arrays (d, h, w).
  static TapWindow taps(DgradShape const& shape, int k_tiles, int tile_m, bool skip_border_taps) {
    TapWindow w;
    w.plane = cutlass::FastDivmod(shape.shape_C[2] * shape.shape_C[3]);
    w.depth = cutlass::FastDivmod(shape.shape_C[1]);
    w.dilation = cutlass::FastDivmod(shape.dilation[0]);
    w.input_depth = shape.shape_A[1];
    w.taps = shape.shape_B[1];
    w.lower_padding = shape.lower_padding[0];
    w.pixels = shape.shape_C[0] * shape.shape_C[1] * shape.shape_C[2] * shape.shape_C[3];
    w.blocks_per_tap = k_tiles / w.taps;
    w.every_tap = !skip_border_taps || skipped_blocks_per_tile(w, shape.shape_C[1], tile_m) <= 1.0;
    return w;
  }
  // The K blocks a tile of one sample skips on average (over at most 4096 of its tiles,
  // evenly spaced). Testing a tile costs its producer and consumers about one K block's
  // time, so the kernel tests only where tiles skip more than one block on average.
  static double skipped_blocks_per_tile(TapWindow const& w, int planes, int tile_m) {
    const int plane_pixels = w.plane.divisor;
    const int64_t pixels = int64_t{planes} * plane_pixels;
    const int64_t tiles = (pixels + tile_m - 1) / tile_m;
    const int64_t step = std::max<int64_t>(1, tiles / 4096);
    const int every = TapRange::every(w).k_tiles;
    int64_t skipped = 0, counted = 0;
    for (int64_t tile = 0; tile < tiles; tile += step, ++counted) {
      const int first_plane = static_cast<int>(tile * tile_m / plane_pixels);
      const int last_plane = static_cast<int>((std::min(pixels, (tile + 1) * tile_m) - 1) / plane_pixels);
      skipped += every - TapRange::reaching_planes(w, first_plane, last_plane).k_tiles;
    }
    return static_cast<double>(skipped) / static_cast<double>(counted);
  }
  // The mainloop's K-block mode is (channel block, s, r, t): a range of depth taps is
  // the blocks from (0, 0, 0, first) on.
  template <class KBlockShape>
  CUTLASS_DEVICE static auto k_block_iterator(KBlockShape const& k_blocks, TapRange taps) {
    static_assert(cute::rank(KBlockShape{}) == 4, "K blocks of a 3-D dgrad: (channel block, s, r, t)");
    return cute::make_coord_iterator(cute::make_coord(0, 0, 0, taps.first_tap), k_blocks);
  }
};

// One phase as the two collectives take it.
template <class ProblemShape, class CollectiveMainloop, class CollectiveEpilogue>
struct PhaseArguments {
  ProblemShape shape;
  typename CollectiveMainloop::Arguments mainloop;
  typename CollectiveEpilogue::Arguments epilogue;
};

// The collectives' own rules (TMA limits, alignment), and that the epilogue needs no
// workspace (the kernel allocates none).
template <class ProblemShape, class CollectiveMainloop, class CollectiveEpilogue>
bool collectives_can_implement(PhaseArguments<ProblemShape, CollectiveMainloop, CollectiveEpilogue> const& args) {
  const auto extents = GemmExtents<ProblemShape>::epilogue(args.shape);
  return CollectiveMainloop::can_implement(args.shape, args.mainloop) &&
         CollectiveEpilogue::can_implement(extents, args.epilogue) &&
         CollectiveEpilogue::get_workspace_size(extents, args.epilogue) == 0;
}

// Two stages (mainloop, epilogue) alternating between the two consumer warpgroups.
using ConsumerOrderBarrier = cutlass::OrderedSequenceBarrier<2, 2>;

// Units the producer may hand out ahead of the consumers: it runs at most a few K blocks
// (the mainloop's stages) ahead, about one unit, so two would do; four cost 32 bytes more.
using PingpongUnitQueue = UnitQueue<4>;

// Shared memory the kernel needs besides the mainloop's stages: what the mainloop's
// builder must carve out when it sizes the pipeline.
template <class CollectiveEpilogue>
constexpr int pingpong_carveout_bytes() {
  constexpr size_t kAlignmentSlack = 256;
  return static_cast<int>(sizeof(typename CollectiveEpilogue::TensorStorage) +
                          sizeof(typename CollectiveEpilogue::PipelineStorage) +
                          sizeof(typename ConsumerOrderBarrier::SharedStorage) +
                          sizeof(typename PingpongUnitQueue::SharedStorage) + kAlignmentSlack);
}

template <class ProblemShape, class CollectiveMainloop_, class CollectiveEpilogue_, int MaxPhases>
class PingpongPhasesKernel {
 public:
  using CollectiveMainloop = CollectiveMainloop_;
  using CollectiveEpilogue = CollectiveEpilogue_;
  using TileShape = typename CollectiveMainloop::TileShape;
  using TiledMma = typename CollectiveMainloop::TiledMma;
  using Extents = GemmExtents<ProblemShape>;
  using ProblemShapeMNKL = decltype(Extents::template mainloop<CollectiveMainloop>(ProblemShape{}));
  using PhaseArguments = sm90::PhaseArguments<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;

  // Read by cutlass::device_kernel's launch bounds.
  static constexpr uint32_t MaxThreadsPerBlock = 3 * cutlass::NumThreadsPerWarpGroup;
  static constexpr uint32_t MinBlocksPerMultiprocessor = 1;
  static_assert(cute::size(TiledMma{}) == cutlass::NumThreadsPerWarpGroup, "one warpgroup per tile");
  using ClusterShape = typename CollectiveMainloop::DispatchPolicy::ClusterShape;
  static constexpr int kClusterM = cute::size<0>(ClusterShape{});
  static_assert(cute::size(ClusterShape{}) == kClusterM, "clusters along M only (PhaseTiles' units)");
  // The consumers hold a 128x128 fp32 accumulator; the producer warp locates tiles,
  // draws and hands out units and walks the im2col coordinates, which spills at 40
  // registers. 56 + 2 x 224 registers x 128 threads fill the file without spills.
  static constexpr uint32_t kProducerRegisters = 56;
  static constexpr uint32_t kConsumerRegisters = 224;

  using MainloopPipeline = typename CollectiveMainloop::MainloopPipeline;
  using EpiLoadPipeline = typename CollectiveEpilogue::LoadPipeline;
  using EpiStorePipeline = typename CollectiveEpilogue::StorePipeline;

  struct SharedStorage {
    struct Pipelines : cute::aligned_struct<16, cute::_1> {
      alignas(16) typename CollectiveMainloop::PipelineStorage mainloop;
      alignas(16) typename CollectiveEpilogue::PipelineStorage epi_load;
      alignas(16) typename ConsumerOrderBarrier::SharedStorage consumer_order;
      alignas(16) typename PingpongUnitQueue::SharedStorage units;
    } pipelines;
    // Separate, not a union: a consumer's epilogue runs while the producer fills stages.
    struct Tensors : cute::aligned_struct<128, cute::_1> {
      typename CollectiveEpilogue::TensorStorage epilogue;
      typename CollectiveMainloop::TensorStorage mainloop;
    } tensors;
  };
  static constexpr int SharedStorageSize = sizeof(SharedStorage);

  struct PhaseParams {
    ProblemShapeMNKL mnkl;
    typename CollectiveMainloop::Params mainloop;
    typename CollectiveEpilogue::Params epilogue;
  };

  struct Params {
    PhaseParams phase[MaxPhases];
    PhaseTiles<MaxPhases, kClusterM, cute::size<0>(TileShape{})> tiles;
    UnitSchedule schedule;  // the counter; launch() decides per launch whether to draw
  };

  // Tile counts (m, n, k) and batch entries (l) of a phase, tiled as the mainloop's
  // load_init tiles its operands.
  static auto tile_counts(ProblemShape const& shape) {
    using namespace cute;
    const auto [M, N, K, L] = Extents::template mainloop<CollectiveMainloop>(shape);
    const auto a_tiles = local_tile(make_identity_tensor(make_shape(M, K)), TileShape{}, make_coord(_, _, _),
                                    Step<_1, Underscore, _1>{});  // (BLK_M, BLK_K, m, k)
    const auto b_tiles = local_tile(make_identity_tensor(make_shape(N, K)), TileShape{}, make_coord(_, _, _),
                                    Step<Underscore, _1, _1>{});  // (BLK_N, BLK_K, n, k)
    return cute::make_tuple(int(size<2>(a_tiles)), int(size<2>(b_tiles)), int(size<3>(a_tiles)), int(L));
  }

  // `count` <= MaxPhases phases of one launch; `skip_border_taps` false runs every K
  // block of every tile (the benchmark's baseline for tap_window.h); `counter` the
  // launch's UnitCounter, nullptr for the static walk.
  static Params to_underlying_arguments(PhaseArguments const* phases, int count, bool skip_border_taps,
                                        UnitCounter* counter) {
    Params params{};
    params.schedule.counter = counter;
    for (int p = 0; p < count; ++p) {
      const ProblemShape& shape = phases[p].shape;
      params.phase[p] = {
          Extents::template mainloop<CollectiveMainloop>(shape),
          CollectiveMainloop::to_underlying_arguments(shape, phases[p].mainloop, nullptr),
          CollectiveEpilogue::to_underlying_arguments(Extents::epilogue(shape), phases[p].epilogue, nullptr)};
      const auto [tiles_m, tiles_n, k_tiles, batch] = tile_counts(shape);
      params.tiles.append_phase(tiles_m, tiles_n, batch,
                                Extents::taps(shape, k_tiles, cute::size<0>(TileShape{}), skip_border_taps));
    }
    return params;
  }

  // One cluster per kClusterM SMs, as many as fit at once (or one per unit, when there
  // are fewer); with clusters, the GPCs' shapes may leave some SMs idle.
  static dim3 get_grid_shape(Params const& params, int resident_clusters) {
    const int clusters = cute::max(1, cute::min(params.tiles.total(), resident_clusters));
    return dim3(static_cast<unsigned>(clusters * kClusterM), 1, 1);
  }
  static dim3 get_block_shape() { return dim3(MaxThreadsPerBlock, 1, 1); }

  static cudaError_t launch(Params const& params, int sm_count, cudaStream_t stream) {
    const auto kernel = &cutlass::device_kernel<PingpongPhasesKernel>;
    int resident_clusters = 0;
    if (cudaError_t e = prepare_device(kernel, sm_count, resident_clusters); e != cudaSuccess) return e;
    ClusterLaunch launch(get_grid_shape(params, resident_clusters), stream);
    const TapWindow* windows = params.tiles.taps;
    const bool uneven_units =
        std::any_of(windows, windows + params.tiles.phases, [](TapWindow const& w) { return !w.every_tap; });
    Params launched = params;
    launched.schedule = unit_schedule(params.schedule.counter, uneven_units, kClusterM, params.tiles.total(),
                                      static_cast<int>(launch.config.gridDim.x) / kClusterM);
    return cudaLaunchKernelEx(&launch.config, kernel, launched);
  }

  // A launch configuration of `grid` CTAs in clusters of kClusterM along x.
  struct ClusterLaunch {
    cudaLaunchAttribute cluster{};
    cudaLaunchConfig_t config{};

    ClusterLaunch(dim3 grid, cudaStream_t stream) {
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = kClusterM;
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
      config.gridDim = grid;
      config.blockDim = get_block_shape();
      config.dynamicSmemBytes = SharedStorageSize;
      config.stream = stream;
      config.attrs = &cluster;
      config.numAttrs = 1;
    }
    ClusterLaunch(const ClusterLaunch&) = delete;  // config points at cluster
  };

  CUTLASS_DEVICE void operator()(Params const& params, char* smem_buf) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using namespace cute;
    SharedStorage& storage = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int warp_group = cutlass::canonical_warp_group_idx();
    const int warp_in_group = cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup;
    const int group_thread = int(threadIdx.x) % cutlass::NumThreadsPerWarpGroup;
    const bool producer_warp = warp_group == 0 && warp_in_group == 0;

    if (producer_warp && cute::elect_one_sync()) {
      for (int p = 0; p < params.tiles.phases; ++p) {
        CollectiveMainloop::prefetch_tma_descriptors(params.phase[p].mainloop);
        CollectiveEpilogue::prefetch_tma_descriptors(params.phase[p].epilogue);
      }
    }

    typename MainloopPipeline::Params mainloop_params;
    if (producer_warp) mainloop_params.role = MainloopPipeline::ThreadCategory::Producer;
    if (warp_group > 0) mainloop_params.role = MainloopPipeline::ThreadCategory::Consumer;
    mainloop_params.is_leader = group_thread == 0;
    mainloop_params.num_consumers = cutlass::NumThreadsPerWarpGroup;  // one consumer warpgroup per stage
    mainloop_params.num_producers = 1;                                // one elected thread issues a stage's TMA loads
    mainloop_params.transaction_bytes = params.phase[0].mainloop.tma_transaction_bytes;  // the same for every phase
    MainloopPipeline mainloop_pipeline(storage.pipelines.mainloop, mainloop_params, ClusterShape{});

    // The source C is void: the load pipeline exists for the collective's interface only.
    typename EpiLoadPipeline::Params epi_load_params;
    if (warp_group > 0) epi_load_params.role = EpiLoadPipeline::ThreadCategory::Consumer;
    epi_load_params.dst_blockid = 0;
    epi_load_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    epi_load_params.consumer_arv_count = cutlass::NumThreadsPerWarpGroup;
    if constexpr (CollectiveEpilogue::RequiresTransactionBytes) {
      epi_load_params.transaction_bytes = params.phase[0].epilogue.tma_transaction_bytes;
    }
    EpiLoadPipeline epi_load_pipeline(storage.pipelines.epi_load, epi_load_params);

    typename EpiStorePipeline::Params epi_store_params;
    epi_store_params.always_wait = true;
    EpiStorePipeline epi_store_pipeline(epi_store_params);

    typename ConsumerOrderBarrier::Params order_params;
    order_params.group_id = cute::max(warp_group - 1, 0);
    order_params.group_size = cutlass::NumThreadsPerWarpGroup;
    ConsumerOrderBarrier consumer_order(storage.pipelines.consumer_order, order_params);

    PingpongUnitQueue units(storage.pipelines.units);

    // Barrier initialization visible to every warp, and in a cluster to the other CTAs'
    // multicast loads and releases.
    if constexpr (kClusterM > 1) {
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      __syncthreads();
    }

    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
      if (producer_warp) produce(params, storage, mainloop_pipeline, units);
    } else {
      cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
      consume(params, storage, mainloop_pipeline, epi_load_pipeline, epi_store_pipeline, consumer_order, units,
              /*second=*/warp_group == 2, group_thread);
    }
#else
    // Compiled for sm_90a only (the TU's architecture): other targets never launch it.
    (void)params;
    (void)smem_buf;
#endif
  }

 private:
  // The cluster's first unit and the units per round of the static walk (the clusters
  // in the grid).
  CUTLASS_DEVICE static int first_unit() { return int(blockIdx.x) / kClusterM; }
  CUTLASS_DEVICE static int unit_stride() { return int(gridDim.x) / kClusterM; }

  // The producer warp: takes the CTA's units, hands each to the consumers, and issues its
  // TMA loads into one pipeline.
  CUTLASS_DEVICE static void produce(Params const& params, SharedStorage& storage, MainloopPipeline pipeline,
                                     PingpongUnitQueue& units) {
    using namespace cute;
    CollectiveMainloop mainloop;
    auto state = cutlass::make_producer_start_state<MainloopPipeline>();
    uint32_t pushed = 0;
    const bool queue_lane = cutlass::canonical_lane_idx() == 0;
    const int rank = int(cute::block_rank_in_cluster());
    const int total = params.tiles.total();
    UnitDrawer drawer(params.schedule);
    for (int unit = first_unit(); unit < total; unit = drawer.next(params.schedule, unit, unit_stride(), total)) {
      if (queue_lane) units.push(pushed, unit);
      const auto work = params.tiles.locate(unit, rank);
      const PhaseParams& phase = params.phase[work.phase];
      auto inputs = mainloop.load_init(phase.mnkl, phase.mainloop);
      const TapRange k_blocks = params.tiles.k_blocks(work);
      const int k_tiles = k_blocks.k_tiles;
      mainloop.load(phase.mainloop, pipeline, state, inputs, make_coord(work.m, work.n, _, work.l),
                    Extents::k_block_iterator(shape<3>(get<0>(inputs)), k_blocks), k_tiles,
                    cutlass::canonical_lane_idx(), uint32_t(rank), storage.tensors.mainloop);
      state.advance(k_tiles);
    }
    if (queue_lane) {
      units.push(pushed, total);
      units.push(pushed, total);
    }
    mainloop.load_tail(pipeline, state);
  }

  // A consumer warpgroup: every other unit the producer hands out (the second consumer
  // starts at the CTA's second), its MMAs and then its epilogue, each in turn with the
  // other consumer's. A tile past the problem (PhaseTiles) has no epilogue.
  CUTLASS_DEVICE static void consume(Params const& params, SharedStorage& storage, MainloopPipeline mainloop_pipeline,
                                     EpiLoadPipeline epi_load_pipeline, EpiStorePipeline epi_store_pipeline,
                                     ConsumerOrderBarrier& consumer_order, PingpongUnitQueue& units, bool second,
                                     int group_thread) {
    using namespace cute;
    constexpr auto c_tiles = CollectiveEpilogue::get_load_pipe_increment(TileShape{});
    constexpr auto d_tiles = CollectiveEpilogue::get_store_pipe_increment(TileShape{});
    const int total = params.tiles.total();
    const int rank = int(cute::block_rank_in_cluster());
    CollectiveMainloop mainloop;
    typename CollectiveMainloop::PipelineState read_state;
    typename CollectiveEpilogue::LoadPipelineState epi_load_state;
    auto epi_store_state = cutlass::make_producer_start_state<EpiStorePipeline>();
    uint32_t popped = 0;
    if (second) {
      read_state.advance(params.tiles.k_tiles_of(units.pop(popped)));  // the first consumer's stages
      epi_load_state.advance(c_tiles);
      epi_store_state.advance(d_tiles);
    }
    TiledMma tiled_mma;
    for (int unit = units.pop(popped); unit < total; unit = units.pop(popped)) {
      const auto work = params.tiles.locate(unit, rank);
      const PhaseParams& phase = params.phase[work.phase];
      const int k_tiles = params.tiles.k_blocks(work).k_tiles;
      Tensor accumulators = partition_fragment_C(tiled_mma, take<0, 2>(TileShape{}));

      consumer_order.wait();
      mainloop.mma(mainloop_pipeline, read_state, accumulators, k_tiles, group_thread, storage.tensors.mainloop,
                   phase.mainloop);
      consumer_order.arrive();
      mainloop.mma_tail(mainloop_pipeline, read_state, k_tiles);
      // The other consumer's next tile, whose stages this one skips (0 past the last).
      read_state.advance(k_tiles + params.tiles.k_tiles_of(units.pop(popped)));

      consumer_order.wait();
      if (work.in_problem) {
        CollectiveEpilogue epilogue(phase.epilogue, storage.tensors.epilogue);
        auto [load_next, store_next] = epilogue.store(
            epi_load_pipeline, epi_load_state, epi_store_pipeline, epi_store_state, phase.mnkl, TileShape{},
            make_coord(work.m, work.n, _, work.l), accumulators, tiled_mma, group_thread, storage.tensors.epilogue);
        // The TMA stores must have read the staging buffers before the other consumer's
        // epilogue reuses them.
        auto [load_after, store_after] =
            epilogue.store_tail(epi_load_pipeline, load_next, epi_store_pipeline, store_next);
        epi_load_state = load_after;
        epi_store_state = store_after;
      } else {
        epi_load_state.advance(c_tiles);
        epi_store_state.advance(d_tiles);
      }
      epi_load_state.advance(c_tiles);
      epi_store_state.advance(d_tiles);
      consumer_order.arrive();
    }
  }

  // Per function and device, once (driver calls cost several microseconds of host time
  // in a call whose kernels may take tens): the opt-in to more than 48 KB of dynamic
  // shared memory, then how many of the kernel's clusters the device holds at once.
  template <class Kernel>
  static cudaError_t prepare_device(Kernel kernel, int sm_count, int& resident_clusters) {
    constexpr int kDevices = 64;
    static std::atomic<int> clusters_of_device[kDevices] = {};  // 0: not prepared yet
    int device = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    std::atomic<int>* known = device < kDevices ? &clusters_of_device[device] : nullptr;
    if (known && (resident_clusters = known->load(std::memory_order_relaxed)) > 0) return cudaSuccess;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SharedStorageSize);
        e != cudaSuccess) {
      return e;
    }
    resident_clusters = sm_count;  // one CTA per SM
    if constexpr (kClusterM > 1) {
      const ClusterLaunch one_cluster(dim3(kClusterM, 1, 1), nullptr);
      if (cudaError_t e = cudaOccupancyMaxActiveClusters(&resident_clusters, kernel, &one_cluster.config);
          e != cudaSuccess) {
        return e;
      }
    }
    resident_clusters = cute::max(1, resident_clusters);
    if (known) known->store(resident_clusters, std::memory_order_relaxed);
    return cudaSuccess;
  }
};

}  // namespace cutlassfuse::sm90
