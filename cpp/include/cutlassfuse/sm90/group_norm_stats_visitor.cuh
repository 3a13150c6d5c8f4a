// An sm90 epilogue visitor (EVT) node that passes its input through to the output
// store and emits GroupNorm partial statistics of the values stored.
//
// Placement: the root of the EVT tree, so its input is exactly what the epilogue
// converts and stores (here ReLU(acc + bias)). Per CTA tile it
//   1. visit():  writes each element, rounded to the stored type, into a shared-memory
//                copy of the tile (the statistics are those of the stored activation,
//                which the normalize pass reads back);
//   2. reduce(): after the tile's last subtile, one warp per (sample segment, group
//                segment) of the tile computes count, mean and M2 over that rectangle of
//                shared memory (one pass of shifted sums), and writes them to a fixed
//                slot of the partials workspace (layout: cutlassfuse::TilePartials).
// A tile may hold rows of any number of samples (output D*H*W smaller than, or not a
// multiple of, the tile's M extent) and columns of any number of groups, including
// groups that continue in the next N tile; each (sample, group) piece gets its own
// slot, so the partials are exact in every case and no atomics are needed.
//
// Why shared memory rather than registers: a thread's fragment mixes rows of several
// samples and columns of several groups, both run-time quantities; the tile copy makes
// the reduction layout-independent. The ping-pong kernel runs epilogues during loads,
// so the 128 x 136 staging tile is carved out of the pipeline (one stage of five for
// 128x128 tiles). Keeping the statistics in registers instead measured slower
// (docs/performance.md, designs rejected).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>
#include <cutlass/numeric_conversion.h>

#include "cutlassfuse/norm/group_norm.h"

namespace cutlassfuse::sm90 {

struct GroupNormStatsArguments {
  WelfordPartial* partials = nullptr;  // TilePartials::slots() entries
  int64_t spatial = 1;                 // rows per sample (Do * Ho * Wo; a batched GEMM: M in whole tiles)
  int channels_per_group = 1;
  int max_segments = 1;
  int max_local_groups = 1;
  int tiles_n = 1;
  int* finish_counters = nullptr;  // zeroed by tile (0, 0) for the finishing kernel (group_norm_finish_counters)
  int64_t finish_counter_count = 0;
};

template <class Element, class CtaTileShapeMNK>
struct Sm90GroupNormStats {
  static constexpr int kTileM = cute::size<0>(CtaTileShapeMNK{});
  static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});
  // Row pitch in elements: 16-byte aligned rows, and 4 banks between consecutive rows
  // of 16-bit elements so the fragment writes of a warp (8 rows x 4 column pairs) are
  // conflict-free (float32 activations, 8 banks apart, take 2-way conflicts).
  static constexpr int kPitch = kTileN + 8;
  static constexpr int kVector = 16 / sizeof(Element);
  static constexpr int kWarps = 4;  // the consumer warpgroup

  struct SharedStorage {
    alignas(16) Element tile[kTileM * kPitch];
  };
  using Arguments = GroupNormStatsArguments;
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.partials != nullptr && args.spatial > 0 && args.channels_per_group > 0;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;  // the partials buffer comes in through Arguments (the sm90 conv kernel sizes no epilogue workspace)
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE Sm90GroupNormStats() {}
  CUTLASS_HOST_DEVICE Sm90GroupNormStats(Params const& params, SharedStorage const& shared_storage)
      : params_(params), smem_(const_cast<Element*>(shared_storage.tile)) {}

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(cutlass::epilogue::fusion::ProducerLoadArgs<Args...> const&) {
    return cutlass::epilogue::fusion::EmptyProducerLoadCallbacks{};
  }

  template <class TileCoords>
  struct ConsumerStoreCallbacks : cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks {
    TileCoords tile_coords;  // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) -> tile-local (m, n) of this thread's elements
    Element* smem;
    Params const& params;
    int64_t tile_row_begin;  // global output row (n * spatial + pixel) of the tile's first row
    int tile_col_begin;
    int rows;  // valid rows and columns of this tile
    int cols;
    int tile_m_index;
    int tile_n_index;
    int thread_idx;

    CUTLASS_DEVICE ConsumerStoreCallbacks(TileCoords tile_coords, Element* smem, Params const& params,
                                          int64_t tile_row_begin, int tile_col_begin, int rows, int cols,
                                          int tile_m_index, int tile_n_index, int thread_idx)
        : tile_coords(tile_coords), smem(smem), params(params), tile_row_begin(tile_row_begin),
          tile_col_begin(tile_col_begin), rows(rows), cols(cols), tile_m_index(tile_m_index),
          tile_n_index(tile_n_index), thread_idx(thread_idx) {}

    template <class ElementAccumulator, class ElementInput, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<ElementInput, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
        cutlass::Array<ElementInput, FragmentSize> const& frg_input) {
      // The same rounding the collective applies before its store.
      cutlass::NumericConverter<Element, ElementInput, cutlass::FloatRoundStyle::round_to_nearest> convert;
      auto coords = tile_coords(cute::_, cute::_, cute::_, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        auto [m, n] = coords(epi_v * FragmentSize + i);
        smem[m * kPitch + n] = convert(frg_input[i]);
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&&, SyncFn const& sync_fn, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration) return;
      sync_fn();  // every thread's subtiles are in shared memory
      write_partials();
      if (tile_m_index == 0 && tile_n_index == 0) zero_finish_counters();
    }

   private:
    CUTLASS_DEVICE void zero_finish_counters() const {
      for (int64_t i = thread_idx; i < params.finish_counter_count; i += kWarps * 32) params.finish_counters[i] = 0;
    }

    struct Rectangle {
      int row_begin, row_end, col_begin, col_end;
    };

    // Count, mean and M2 of the rectangle of the staged tile. One pass of sums shifted
    // by the rectangle's first value: with a shift inside the data, fp32 cancellation
    // stays bounded over a tile's at most 16K values, and the tile costs one read of
    // shared memory. This runs on one consumer warpgroup, one warp per scheduler, so
    // latency is the cost: lanes take kUnroll independent 16-byte loads per step (when
    // the rectangle's columns are aligned to them), feed separate accumulators, and the
    // warp sums in a fixed butterfly at the end.
    CUTLASS_DEVICE WelfordPartial warp_moments(Rectangle r, int lane) const {
      constexpr int kUnroll = 8;
      const float shift = static_cast<float>(smem[r.row_begin * kPitch + r.col_begin]);
      float sum[2] = {0.f, 0.f};
      float squares[2] = {0.f, 0.f};
      const int width = r.col_end - r.col_begin;
      const bool vectorized = r.col_begin % kVector == 0 && width % kVector == 0;
      const int per_row = vectorized ? width / kVector : width;  // work units per row
      // (row, unit) of the lane's next unit, advanced by 32 units without divisions.
      int row = r.row_begin + lane / per_row;
      int unit = lane % per_row;
      const int row_step = 32 / per_row;
      const int unit_step = 32 % per_row;
      auto advance = [&] {
        row += row_step;
        unit += unit_step;
        if (unit >= per_row) {
          unit -= per_row;
          ++row;
        }
      };
      if (vectorized) {
        while (row < r.row_end) {
          cutlass::Array<Element, kVector> v[kUnroll];
          bool valid[kUnroll];
          CUTLASS_PRAGMA_UNROLL
          for (int u = 0; u < kUnroll; ++u) {
            valid[u] = row < r.row_end;
            if (valid[u]) {
              v[u] = *reinterpret_cast<cutlass::Array<Element, kVector> const*>(smem + row * kPitch + r.col_begin +
                                                                                unit * kVector);
            }
            advance();
          }
          CUTLASS_PRAGMA_UNROLL
          for (int u = 0; u < kUnroll; ++u) {
            CUTLASS_PRAGMA_UNROLL
            for (int i = 0; i < kVector; ++i) {
              const float x = valid[u] ? static_cast<float>(v[u][i]) - shift : 0.f;
              sum[i % 2] += x;
              squares[i % 2] = fmaf(x, x, squares[i % 2]);
            }
          }
        }
      } else {
        for (; row < r.row_end; advance()) {
          const float x = static_cast<float>(smem[row * kPitch + r.col_begin + unit]) - shift;
          sum[0] += x;
          squares[0] = fmaf(x, x, squares[0]);
        }
      }
      float s = sum[0] + sum[1];
      float q = squares[0] + squares[1];
      CUTLASS_PRAGMA_UNROLL
      for (int offset = 16; offset > 0; offset /= 2) {
        s += __shfl_xor_sync(0xffffffffu, s, offset);
        q += __shfl_xor_sync(0xffffffffu, q, offset);
      }
      const float count = static_cast<float>((r.row_end - r.row_begin) * width);
      const float shifted_mean = s / count;
      return {count, shift + shifted_mean, cute::max(q - s * shifted_mean, 0.f)};
    }

    // Groups narrower than a vector (a power of two below kVector channels): a warp
    // takes the rows of one sample segment over one 16-byte column of the tile, which
    // holds kVector / kGroupWidth whole groups, so every lane load is a vector and the
    // warp writes several groups' partials. (One warp per group rectangle would read
    // one element per lane per step: that made the epilogue, not the MMAs, bound the
    // strided video shapes, whose 4-channel groups sit in 128x64 tiles.)
    template <int kGroupWidth>
    CUTLASS_DEVICE void write_narrow_partials(int64_t first_sample, int segments, int first_group) const {
      constexpr int kGroups = kVector / kGroupWidth;  // per 16-byte column
      const int warp = thread_idx / 32;
      const int lane = thread_idx % 32;
      const int columns = cols / kVector;
      for (int item = warp; item < segments * columns; item += kWarps) {
        const int segment = item / columns;
        const int col = (item % columns) * kVector;
        const int64_t sample_row = (first_sample + segment) * params.spatial;
        const int row_begin = static_cast<int>(cute::max(sample_row - tile_row_begin, int64_t{0}));
        const int row_end = static_cast<int>(cute::min(sample_row + params.spatial - tile_row_begin, int64_t{rows}));
        float shift[kGroups];
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          shift[g] = static_cast<float>(smem[row_begin * kPitch + col + g * kGroupWidth]);
        }
        float sum[kGroups] = {};
        float squares[kGroups] = {};
#pragma unroll 4
        for (int row = row_begin + lane; row < row_end; row += 32) {
          const auto v = *reinterpret_cast<cutlass::Array<Element, kVector> const*>(smem + row * kPitch + col);
          CUTLASS_PRAGMA_UNROLL
          for (int i = 0; i < kVector; ++i) {
            const float x = static_cast<float>(v[i]) - shift[i / kGroupWidth];
            sum[i / kGroupWidth] += x;
            squares[i / kGroupWidth] = fmaf(x, x, squares[i / kGroupWidth]);
          }
        }
        CUTLASS_PRAGMA_UNROLL
        for (int g = 0; g < kGroups; ++g) {
          CUTLASS_PRAGMA_UNROLL
          for (int offset = 16; offset > 0; offset /= 2) {
            sum[g] += __shfl_xor_sync(0xffffffffu, sum[g], offset);
            squares[g] += __shfl_xor_sync(0xffffffffu, squares[g], offset);
          }
        }
        if (lane == 0) {
          const float count = static_cast<float>((row_end - row_begin) * kGroupWidth);
          CUTLASS_PRAGMA_UNROLL
          for (int g = 0; g < kGroups; ++g) {
            const float shifted_mean = sum[g] / count;
            const int local_group = (tile_col_begin + col) / kGroupWidth + g - first_group;
            params.partials[slot(segment, local_group)] = {count, shift[g] + shifted_mean,
                                                           cute::max(squares[g] - sum[g] * shifted_mean, 0.f)};
          }
        }
      }
    }

    CUTLASS_DEVICE int64_t slot(int segment, int local_group) const {
      return tile_partial_slot(tile_m_index, segment, tile_n_index, local_group, params.max_segments, params.tiles_n,
                               params.max_local_groups);
    }

    CUTLASS_DEVICE void write_partials() const {
      const int64_t spatial = params.spatial;
      const int cpg = params.channels_per_group;
      const int64_t first_sample = tile_row_begin / spatial;
      const int segments = static_cast<int>((tile_row_begin + rows - 1) / spatial - first_sample + 1);
      const int first_group = tile_col_begin / cpg;
      // Tiles start at multiples of kVector columns and Cout is a multiple of 8.
      if constexpr (kVector > 4) {
        if (cpg == 4) return write_narrow_partials<4>(first_sample, segments, first_group);
      }
      if (cpg == 2) return write_narrow_partials<2>(first_sample, segments, first_group);
      if (cpg == 1) return write_narrow_partials<1>(first_sample, segments, first_group);
      const int local_groups = (tile_col_begin + cols - 1) / cpg - first_group + 1;
      const int warp = thread_idx / 32;
      const int lane = thread_idx % 32;
      for (int item = warp; item < segments * local_groups; item += kWarps) {
        const int segment = item / local_groups;
        const int local_group = item % local_groups;
        const int64_t sample_row = (first_sample + segment) * spatial;  // global row of the sample's first pixel
        const int group_col = (first_group + local_group) * cpg;
        const Rectangle r{static_cast<int>(cute::max(sample_row - tile_row_begin, int64_t{0})),
                          static_cast<int>(cute::min(sample_row + spatial - tile_row_begin, int64_t{rows})),
                          cute::max(group_col - tile_col_begin, 0), cute::min(group_col + cpg - tile_col_begin, cols)};
        const WelfordPartial moments = warp_moments(r, lane);
        if (lane == 0) params.partials[slot(segment, local_group)] = moments;
      }
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(cutlass::epilogue::fusion::ConsumerStoreArgs<Args...> const& args) {
    using namespace cute;
    // Tile-local coordinates of this thread's fragment elements, in the order visit()
    // receives them.
    Tensor tile_coords = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
        make_identity_tensor(take<0, 2>(args.tile_shape_mnk)), args.epi_tile, args.tiled_copy, args.thread_idx);
    // The statistics number the rows of all samples in one sequence, sample n's pixel
    // (d, h, w) at n * spatial + (d * Ho + h) * Wo + w. A convolution's M is that
    // sequence already (L = 1); a batched GEMM runs one sample per L entry, with
    // `spatial` its M rounded up to whole tiles, so its tile (m, l) is tile
    // l * tiles_m + m of the sequence and never holds two samples.
    auto [M, N, K, L] = args.problem_shape_mnkl;
    const int m_index = static_cast<int>(get<0>(args.tile_coord_mnkl));
    const int tile_n_index = static_cast<int>(get<1>(args.tile_coord_mnkl));
    const int tiles_m = static_cast<int>((int64_t(M) + kTileM - 1) / kTileM);
    const int tile_m_index = static_cast<int>(get<3>(args.tile_coord_mnkl)) * tiles_m + m_index;
    const int64_t row_begin = int64_t{tile_m_index} * kTileM;
    const int col_begin = tile_n_index * kTileN;
    const int rows = static_cast<int>(cute::min(int64_t(M) - int64_t{m_index} * kTileM, int64_t{kTileM}));
    const int cols = cute::min(int(N) - col_begin, int{kTileN});
    return ConsumerStoreCallbacks<decltype(tile_coords)>(tile_coords, smem_, params_, row_begin, col_begin, rows, cols,
                                                         tile_m_index, tile_n_index, args.thread_idx);
  }

 private:
  Params params_;
  Element* smem_ = nullptr;
};

}  // namespace cutlassfuse::sm90
