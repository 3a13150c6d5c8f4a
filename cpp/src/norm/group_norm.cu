// GroupNorm over a post-ReLU activation stored NDHWC: a fixed-order merge of the
// epilogue's partial statistics, then a normalize pass writing the caller's memory
// format. See cutlassfuse/norm/group_norm.h.
#include <algorithm>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/norm/group_norm_finalize.cuh"
#include "cutlassfuse/norm/shuffle_index.cuh"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Per-channel scale and shift live in shared memory next to the transpose tile.
constexpr int64_t kMaxChannels = 1024;
// A normalize block handles whole tiles of kTile rows; NCDHW output goes through a
// shared-memory transpose of kTile rows x kTile channels.
constexpr int kTile = 64;
constexpr int kFinishBlocksPerSM = 4;  // group_norm_finish_kernel's register budget, see there

// Block (g, n) finalizes (sample n, group g), all its kFinalizeWarps warps merging
// segments: thousands of resident threads per SM hide the loads' latency.
template <int kFinalizeWarps>
__global__ void __launch_bounds__(kFinalizeWarps * 32)
group_norm_finalize_kernel(const __grid_constant__ SingleRegionFinalize finalize) {
  __shared__ FinalizeScratch<kFinalizeWarps, 1> scratch;
  finalize_group(finalize, blockIdx.y, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x / 32), scratch,
                 [] { __syncthreads(); });
}

// Below this many (sample, group) items the finalize runs 1024-thread blocks: with few
// items (InstanceNorm of one sample over 32 channels) every SM holds at most one block,
// and a block's rounds of 128-partial segments (8 warps: thousands of partials of
// 256-pixel tiles take dozens of rounds) serialize on their latency.
constexpr int64_t kWideFinalizeItems = 256;

// --- normalize ---------------------------------------------------------------------------

// The scale and shift of sample n, written by other blocks of this kernel (read from L2).
__device__ void load_scale_shift(const float2* __restrict__ scale_shift, int64_t n, int channels, float* scale,
                                 float* shift) {
  for (int c = threadIdx.x; c < channels; c += kThreads) {
    const float2 ss = __ldcg(&scale_shift[n * channels + c]);
    scale[c] = ss.x;
    shift[c] = ss.y;
  }
  __syncthreads();
}

// kTile rows of channels-last output, 16-byte vectors, in place allowed (each element
// is read and written by the same thread). A plain loop: at 40 registers many blocks
// stay resident, faster than batching loads per thread, which doubles the registers
// and halves the resident blocks.
template <class T, bool kShuffled>
__device__ void normalize_rows_channels_last(const T* activation, T* out, T* activation_in_pixel_order,
                                             int64_t row_begin, int rows, int channels, const ShuffleIndex& order,
                                             const float* scale, const float* shift) {
  const int vectors_per_row = channels / kVector;
  for (int i = threadIdx.x; i < rows * vectors_per_row; i += kThreads) {
    const int64_t pixel = row_begin + i / vectors_per_row;
    const int c0 = (i % vectors_per_row) * kVector;
    float v[kVector];
    load_vector(activation + source_row<kShuffled>(pixel, order) * channels + c0, v);
    if (kShuffled && activation_in_pixel_order != nullptr)
      store_vector(activation_in_pixel_order + pixel * channels + c0, v);
#pragma unroll
    for (int k = 0; k < kVector; ++k) v[k] = fmaf(v[k], scale[c0 + k], shift[c0 + k]);
    store_vector(out + pixel * channels + c0, v);
  }
}

// kTile rows of NCDHW output, kTile channels at a time: coalesced 16-byte loads along
// the channels, a padded fp32 shared-memory transpose, then stores along the spatial
// dimension, a warp covering 32 consecutive rows of one channel (64 contiguous bytes):
// the fastest of the variants measured (docs/performance.md, designs rejected).
template <class T, bool kShuffled>
__device__ void normalize_rows_ncdhw(const T* activation, T* sample_out, T* activation_in_pixel_order,
                                     int64_t row_begin, int rows, int channels, int64_t spatial,
                                     const ShuffleIndex& order, const float* scale, const float* shift) {
  constexpr int kVectorsPerTileRow = kTile / kVector;          // 8
  constexpr int kRowsPerLoad = kThreads / kVectorsPerTileRow;  // 32
  constexpr int kChannelsPerStore = kThreads / kTile;          // 4
  __shared__ float tile[kTile][kTile + 1];  // [channel][row]; +1 keeps the transposed writes conflict-free
  for (int c_begin = 0; c_begin < channels; c_begin += kTile) {
    const int c_count = min(kTile, channels - c_begin);
    const int load_c = (threadIdx.x % kVectorsPerTileRow) * kVector;
    if (load_c < c_count) {
      for (int r = threadIdx.x / kVectorsPerTileRow; r < rows; r += kRowsPerLoad) {
        float v[kVector];
        load_vector(activation + source_row<kShuffled>(row_begin + r, order) * channels + c_begin + load_c, v);
        if (kShuffled && activation_in_pixel_order != nullptr) {
          store_vector(activation_in_pixel_order + (row_begin + r) * channels + c_begin + load_c, v);
        }
#pragma unroll
        for (int k = 0; k < kVector; ++k) {
          const int c = c_begin + load_c + k;
          tile[load_c + k][r] = fmaf(v[k], scale[c], shift[c]);
        }
      }
    }
    __syncthreads();
    const int store_r = threadIdx.x % kTile;
    if (store_r < rows) {
      for (int c = threadIdx.x / kTile; c < c_count; c += kChannelsPerStore) {
        sample_out[(c_begin + c) * spatial + row_begin + store_r] = from_float<T>(tile[c][store_r]);
      }
    }
    __syncthreads();
  }
}

// What the finishing kernel's blocks do besides the finalize.
struct NormalizeJob {
  const void* activation;
  void* out;
  void* activation_in_pixel_order;  // of a space-to-depth activation that is kept, else nullptr
  ShuffleIndex order;
  int64_t spatial;
  int* groups_finalized;   // [batch], zero at the start
  int64_t rows_per_block;  // a multiple of kTile
  int64_t blocks_per_sample;
};

// Asks L2 for the activation rows [first_row, end_row) of a sample, so that their DRAM
// latency overlaps with the block's wait for the statistics and its scale and shift load.
template <bool kShuffled, class T>
__device__ void prefetch_rows(const T* sample_in, int64_t first_row, int64_t end_row, int channels,
                              const ShuffleIndex& order) {
  constexpr int kLineBytes = 128;
  const int lines_per_row = ceil_div(channels * static_cast<int>(sizeof(T)), kLineBytes);
  const int lines = static_cast<int>(end_row - first_row) * lines_per_row;
  for (int i = threadIdx.x; i < lines; i += kThreads) {
    const int64_t row = source_row<kShuffled>(first_row + i / lines_per_row, order);
    const char* line = reinterpret_cast<const char*>(sample_in + row * channels) + (i % lines_per_row) * kLineBytes;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

// What the finalize and the normalize blocks keep in shared memory; the NCDHW
// transpose tile is normalize_rows_ncdhw's own.
union FinishStorage {
  FinalizeScratch<kWarps> finalize;
  struct {
    float scale[kMaxChannels];
    float shift[kMaxChannels];
  } normalize;
};

// Blocks 0 .. batch x groups - 1 finalize a (sample, group) each (eight warps, the
// same merge as group_norm_finalize) and count it for its sample; the other blocks
// normalize rows_per_block rows of one sample once all its groups are counted
// (group_norm_finalize.cuh). Block order rather than tickets from an atomic counter: a
// ticket costs an atomic on one address and its round trip per block, and measured
// slower.
// Four blocks per SM: the finalize branch's merge would otherwise take the kernel to two
// resident blocks; five spill.
// Blocks take samples and rows newest first: the deconvolution's last tiles (the last
// sample's last rows) are the activation still in L2 when this kernel starts.
template <class T, bool kChannelsLast, bool kShuffled>
__global__ void __launch_bounds__(kThreads, kFinishBlocksPerSM)
    group_norm_finish_kernel(const __grid_constant__ StatisticsFinalize finalize,
                             const __grid_constant__ NormalizeJob job) {
  __shared__ FinishStorage storage;
  const int64_t block_index = blockIdx.x;
  const int64_t finalize_items = finalize.batch * finalize.num_groups;
  if (block_index < finalize_items) {
    finalize_and_count(finalize, finalize.batch - 1 - block_index / finalize.num_groups,
                       static_cast<int>(block_index % finalize.num_groups), job.groups_finalized, storage.finalize);
    return;
  }

  const int64_t block = finalize.batch * job.blocks_per_sample - 1 - (block_index - finalize_items);
  const int64_t n = block / job.blocks_per_sample;
  const int64_t first_row = (block - n * job.blocks_per_sample) * job.rows_per_block;
  const int64_t end_row = min(job.spatial, first_row + job.rows_per_block);
  const int64_t sample_offset = n * job.spatial * finalize.channels;
  const T* sample_in = static_cast<const T*>(job.activation) + sample_offset;
  T* sample_out = static_cast<T*>(job.out) + sample_offset;
  T* sample_kept = job.activation_in_pixel_order == nullptr
                       ? nullptr
                       : static_cast<T*>(job.activation_in_pixel_order) + sample_offset;
  prefetch_rows<kShuffled>(sample_in, first_row, end_row, finalize.channels, job.order);
  wait_for_sample(job.groups_finalized, n, finalize.num_groups);
  float* scale = storage.normalize.scale;
  float* shift = storage.normalize.shift;
  load_scale_shift(finalize.scale_shift, n, finalize.channels, scale, shift);
  for (int64_t row_begin = first_row; row_begin < end_row; row_begin += kTile) {
    const int rows = static_cast<int>(min(job.spatial - row_begin, int64_t{kTile}));
    if constexpr (kChannelsLast) {
      normalize_rows_channels_last<T, kShuffled>(sample_in, sample_out, sample_kept, row_begin, rows, finalize.channels,
                                                 job.order, scale, shift);
    } else {
      normalize_rows_ncdhw<T, kShuffled>(sample_in, sample_out, sample_kept, row_begin, rows, finalize.channels,
                                         job.spatial, job.order, scale, shift);
    }
  }
}

// Rows per normalize block: two tiles for channels-last output, enough to amortize
// loading the sample's scale and shift; one for NCDHW output, whose transpose already
// gives each block a few loads per thread (twice as many measured slower).
int64_t rows_per_normalize_block(bool channels_last_output) { return kTile * (channels_last_output ? 2 : 1); }

template <class T, bool kChannelsLast, bool kShuffled>
void launch_finish(const StatisticsFinalize& finalize, const NormalizeJob& job, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(finalize.batch * (finalize.num_groups + job.blocks_per_sample));
  group_norm_finish_kernel<T, kChannelsLast, kShuffled><<<blocks, kThreads, 0, stream>>>(finalize, job);
  check_launch("group_norm_finish_kernel");
}

template <class T>
void launch_finish(const StatisticsFinalize& finalize, const NormalizeJob& job, bool shuffled,
                   bool channels_last_output, cudaStream_t stream) {
  if (channels_last_output) {
    shuffled ? launch_finish<T, true, true>(finalize, job, stream)
             : launch_finish<T, true, false>(finalize, job, stream);
  } else {
    shuffled ? launch_finish<T, false, true>(finalize, job, stream)
             : launch_finish<T, false, false>(finalize, job, stream);
  }
}

}  // namespace

TilePartials TilePartials::for_tiles(const GroupNormShape& shape, int tile_m, int tile_n) {
  const int64_t channels_per_group = shape.channels / shape.num_groups;
  const int64_t max_segments = std::min<int64_t>(tile_m, (tile_m - 1) / shape.spatial + 2);
  const int64_t max_local_groups = std::min<int64_t>({tile_n, (tile_n - 1) / channels_per_group + 2, shape.num_groups});
  return {tile_m, tile_n, static_cast<int>(ceil_div(shape.channels, tile_n)), static_cast<int>(max_segments),
          static_cast<int>(max_local_groups)};
}

int64_t TilePartials::slots(const GroupNormShape& shape) const {
  return ceil_div(shape.batch * shape.spatial, tile_m) * max_segments * tiles_n * max_local_groups;
}

int64_t group_norm_scale_shift_bytes(const GroupNormShape& shape) {
  return shape.batch * shape.channels * static_cast<int64_t>(sizeof(float2));
}

const char* group_norm_unsupported_reason(const GroupNormShape& shape) {
  if (shape.channels % kVector != 0) return "channels not a multiple of 8 (vectors of 8 elements)";
  if (shape.channels > kMaxChannels) return "more than 1024 output channels";
  if (shape.batch > 65535) return "batch larger than 65535 (grid z limit of the input's layout conversion)";
  if (shape.num_groups > (int64_t{1} << 31) - 1) return "too many groups";
  // group_norm_finish's blocks, a 1D grid: at most batch * (groups + spatial / kTile).
  if (shape.batch * (shape.num_groups + ceil_div(shape.spatial, kTile)) > (int64_t{1} << 31) - 1)
    return "spatial extent too large";
  return "";
}

void group_norm_finalize(const SingleRegionFinalize& finalize, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(finalize.num_groups), static_cast<unsigned>(finalize.batch));
  if (finalize.batch * finalize.num_groups < kWideFinalizeItems) {
    group_norm_finalize_kernel<32><<<grid, 32 * 32, 0, stream>>>(finalize);
  } else {
    group_norm_finalize_kernel<kWarps><<<grid, kThreads, 0, stream>>>(finalize);
  }
  check_launch("group_norm_finalize_kernel");
}

void group_norm_finish(const StatisticsFinalize& finalize, int* groups_finalized, const void* activation,
                       const PixelShuffle& order, int64_t spatial, bool channels_last_output, void* output,
                       void* activation_in_pixel_order, cudaStream_t stream) {
  const bool shuffled = !order.identity();
  const int64_t rows_per_block = rows_per_normalize_block(channels_last_output);
  const NormalizeJob job{activation,
                         output,
                         activation_in_pixel_order,
                         shuffled ? ShuffleIndex(order) : ShuffleIndex(),
                         spatial,
                         groups_finalized,
                         rows_per_block,
                         ceil_div(spatial, rows_per_block)};
  switch (finalize.element) {
    case ElementType::kFloat16: return launch_finish<__half>(finalize, job, shuffled, channels_last_output, stream);
    case ElementType::kBFloat16:
      return launch_finish<__nv_bfloat16>(finalize, job, shuffled, channels_last_output, stream);
    case ElementType::kFloat32: return launch_finish<float>(finalize, job, shuffled, channels_last_output, stream);
  }
}

}  // namespace cutlassfuse
