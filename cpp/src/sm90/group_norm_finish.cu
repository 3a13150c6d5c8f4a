// The finishing kernel for NCDHW output on sm90: bulk copies move the bytes, the
// threads only normalize and transpose in shared memory.
//
// Writing NCDHW from an NDHWC activation scatters every block's output over all C
// channel planes; how long a run each plane gets at once decides how well DRAM takes
// the writes. group_norm.cu's register path writes 128 bytes per plane per block, and
// keeps little in flight (its threads' registers). Here a block takes a strip of up to
// 128 pixels of one sample, all channels:
//   1. bulk tensor loads bring the NDHWC activation rows, 64 pixels x C per chunk, into
//      shared memory (128-byte swizzle, 64 channels per box), issued before the block
//      waits for its sample's statistics;
//   2. each warp reads 8x8 blocks transposed (ldmatrix.trans), applies the per-channel
//      scale and shift in fp32 (the register path's arithmetic, so the bits are the
//      same) and writes them to the strip, [C][pixels] (stmatrix);
//   3. each channel's row of the strip leaves as one bulk copy, clipped at the
//      sample's last pixel (the loads' rows past it read as zeros).
// The first batch x groups blocks finalize, as in group_norm.cu (the same merge).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cutlassfuse/norm/group_norm_finalize.cuh"
#include "cutlassfuse/sm90/group_norm_finish.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPixels = 64;          // per activation chunk
constexpr int kChannelsPerBox = 64;  // per activation load: one 128-byte swizzle row
constexpr int kSwizzleAlign = 1024;  // a 128-byte swizzle pattern repeats every 8 rows
constexpr int kBoxBytes = kPixels * kChannelsPerBox * 2;
constexpr int kMaxChunks = 2;  // per strip: all of a strip's chunks load at once
constexpr int kStripPad = 16;  // bytes after each channel row of the strip
constexpr auto kEvictNormal = static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL);

struct BulkFinishJob {
  CUtensorMap activation;  // [batch][spatial][channels], boxes of 64 channels x 64 pixels
  void* output;            // [batch][channels][spatial]
  int spatial;
  int* groups_finalized;  // [batch], zero at the start
  int blocks_per_sample;
  int chunks;  // 64-pixel chunks per strip
};

__host__ __device__ constexpr int tile_bytes(int channels) { return channels * kPixels * 2; }

__host__ __device__ constexpr int normalize_smem_bytes(int channels, int chunks) {
  return chunks * tile_bytes(channels) + channels * (chunks * kPixels * 2 + kStripPad) +
         2 * channels * static_cast<int>(sizeof(float)) + kMaxChunks * static_cast<int>(sizeof(uint64_t));
}

constexpr int smem_bytes(int channels, int chunks) {
  return kSwizzleAlign + std::max<int>(normalize_smem_bytes(channels, chunks), sizeof(FinalizeScratch<kWarps>));
}

// Strips of 128 pixels (256-byte runs per channel plane), or 64 where two blocks of 128
// would not fit on an SM (256 channels): longer strips leave fewer blocks to spread
// over the SMs, shorter ones shorter runs per channel plane.
constexpr int chunks_per_strip(int channels) {
  // An sm90 SM has 228 KB of shared memory, of which the system keeps 1 KB per block.
  constexpr int kTwoBlocksPerSM = 228 * 1024 / 2 - 1024;
  return smem_bytes(channels, kMaxChunks) <= kTwoBlocksPerSM ? kMaxChunks : 1;
}
static_assert(chunks_per_strip(64) == 2 && chunks_per_strip(128) == 2 && chunks_per_strip(192) == 2 &&
              chunks_per_strip(256) == 1);

// A 32-bit register holding two 16-bit elements, normalized element by element as
// group_norm.cu's register path does (fp32 fma, round to nearest).
template <class T>
__device__ __forceinline__ uint32_t normalize_pair(uint32_t bits, float scale, float shift) {
  T pair[2];
  memcpy(pair, &bits, sizeof(bits));
  for (T& v : pair) v = from_float<T>(fmaf(to_float(v), scale, shift));
  memcpy(&bits, pair, sizeof(bits));
  return bits;
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of 128-byte rows under
// the tensor map's 128-byte swizzle (chunk index XOR row mod 8).
__device__ __forceinline__ int swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row % 8)) * 16); }

// Four 8x8 blocks per step: 8 pixels x 32 channels of box `box`. Lane l addresses row
// l % 8 of block l / 8: in the activation tile a pixel row, in the strip a channel row;
// ldmatrix.trans hands lane l channel l / 4 and pixels 2(l % 4), +1 of each block, which
// is what stmatrix expects of a [channel][pixel] block. The strip's rows are padded by
// 16 bytes, so the eight rows of a block fall in different banks.
template <class T>
__device__ void normalize_transpose(const char* activation_tile, char* strip, int strip_pitch, int first_column,
                                    int channels, const float* scale, const float* shift) {
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  constexpr int kChunksPerStep = 4;
  constexpr int kStepsPerBox = (kPixels / 8) * (kChannelsPerBox / 8 / kChunksPerStep);
  const int steps = channels / kChannelsPerBox * kStepsPerBox;
  for (int step = warp; step < steps; step += kWarps) {
    const int box = step / kStepsPerBox;
    const int pixel_group = (step % kStepsPerBox) / 2;
    const int first_chunk = (step % 2) * kChunksPerStep;
    const int row = pixel_group * 8 + lane % 8;
    const char* source = activation_tile + box * kBoxBytes + swizzled(row, first_chunk + lane / 8);
    uint32_t pairs[kChunksPerStep];
    cute::SM75_U16x8_LDSM_T::copy(*reinterpret_cast<const cute::uint128_t*>(source), pairs[0], pairs[1], pairs[2],
                                  pairs[3]);
#pragma unroll
    for (int k = 0; k < kChunksPerStep; ++k) {
      const int c = box * kChannelsPerBox + (first_chunk + k) * 8 + lane / 4;
      pairs[k] = normalize_pair<T>(pairs[k], scale[c], shift[c]);
    }
    const int channel = box * kChannelsPerBox + (first_chunk + lane / 8) * 8 + lane % 8;
    char* target = strip + channel * strip_pitch + (first_column + pixel_group * 8) * 2;
    cute::SM90_U32x4_STSM_N::copy(pairs[0], pairs[1], pairs[2], pairs[3], *reinterpret_cast<cute::uint128_t*>(target));
  }
}

// Where a normalize block keeps what: its activation chunks, the strip, the sample's
// scale and shift, a transaction barrier per chunk.
struct StripLayout {
  int chunk_bytes, strip_pitch;
  char* chunks;
  char* strip;
  float* scale;
  float* shift;
  uint64_t* loaded;

  __device__ StripLayout(char* smem, int channels, int chunk_count)
      : chunk_bytes(tile_bytes(channels)), strip_pitch(chunk_count * kPixels * 2 + kStripPad) {
    chunks = smem;
    strip = smem + chunk_count * chunk_bytes;
    scale = reinterpret_cast<float*>(strip + channels * strip_pitch);
    shift = scale + channels;
    loaded = reinterpret_cast<uint64_t*>(shift + channels);
  }
  __device__ char* chunk(int q) const { return chunks + q * chunk_bytes; }
};

__device__ __forceinline__ void load_chunk(const BulkFinishJob& job, const StripLayout& smem, int channels, int chunk,
                                           int first_pixel, int n) {
  cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&smem.loaded[chunk], smem.chunk_bytes);
  for (int box = 0; box < channels / kChannelsPerBox; ++box) {
    cute::SM90_TMA_LOAD_3D::copy(&job.activation, &smem.loaded[chunk], kEvictNormal,
                                 smem.chunk(chunk) + box * kBoxBytes, box * kChannelsPerBox,
                                 first_pixel + chunk * kPixels, n);
  }
}

// Blocks 0 .. batch x groups - 1 finalize; the others normalize a strip of
// 64 x job.chunks pixels of a sample, samples and strips newest first (the conv's last
// tiles are what L2 still holds), once all its groups are counted (blocks of lower
// index, which the GPU starts first). A strip's channel rows leave as one bulk copy
// each: the run per channel plane, against the blocks per SM, sets how well DRAM takes
// the writes (chunks_per_strip).
template <class T>
__global__ void __launch_bounds__(kThreads)
group_norm_finish_bulk_kernel(const __grid_constant__ StatisticsFinalize finalize,
                              const __grid_constant__ BulkFinishJob job) {
  extern __shared__ char raw_smem[];
  char* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw_smem) + kSwizzleAlign - 1) &
                                          ~uintptr_t{kSwizzleAlign - 1});
  const int64_t finalize_items = finalize.batch * finalize.num_groups;
  if (blockIdx.x < finalize_items) {
    finalize_and_count(finalize, finalize.batch - 1 - blockIdx.x / finalize.num_groups,
                       static_cast<int>(blockIdx.x % finalize.num_groups), job.groups_finalized,
                       *reinterpret_cast<FinalizeScratch<kWarps>*>(aligned));
    return;
  }

  const int channels = finalize.channels;
  const int chunks = job.chunks;
  const StripLayout smem(aligned, channels, chunks);
  // 32-bit: the grid's blocks (group_norm_unsupported_reason); a 64-bit division is a
  // subroutine call, whose saved registers spilled.
  const auto block = static_cast<uint32_t>(finalize.batch * job.blocks_per_sample - 1 - (blockIdx.x - finalize_items));
  const auto blocks_per_sample = static_cast<uint32_t>(job.blocks_per_sample);
  const auto n = static_cast<int>(block / blocks_per_sample);
  const auto first_pixel = static_cast<int>(block - n * blocks_per_sample) * kPixels * chunks;
  if (threadIdx.x == 0) {
    for (int q = 0; q < chunks; ++q) cutlass::arch::ClusterBarrier::init(&smem.loaded[q], 1);
    cutlass::arch::fence_barrier_init();
    for (int q = 0; q < chunks; ++q) load_chunk(job, smem, channels, q, first_pixel, n);
  }
  wait_for_sample(job.groups_finalized, n, finalize.num_groups);
  for (int c = threadIdx.x; c < channels; c += kThreads) {
    const float2 ss = __ldcg(&finalize.scale_shift[int64_t{n} * channels + c]);
    smem.scale[c] = ss.x;
    smem.shift[c] = ss.y;
  }
  __syncthreads();
  for (int q = 0; q < chunks; ++q) {
    cutlass::arch::ClusterBarrier::wait(&smem.loaded[q], 0);
    normalize_transpose<T>(smem.chunk(q), smem.strip, smem.strip_pitch, q * kPixels, channels, smem.scale, smem.shift);
  }
  cutlass::arch::fence_view_async_shared();  // the strip's generic-proxy writes, before the bulk copies read it
  __syncthreads();
  const int pixels = min(chunks * kPixels, job.spatial - first_pixel);
  T* sample_out = static_cast<T*>(job.output) + int64_t{n} * channels * job.spatial + first_pixel;
  for (int c = threadIdx.x; c < channels; c += kThreads) {
    cute::SM90_BULK_COPY_S2G::copy(smem.strip + c * smem.strip_pitch, sample_out + int64_t{c} * job.spatial,
                                   pixels * 2);
  }
  cute::tma_store_arrive();
  cute::tma_store_wait<0>();  // the strip is read before the block's shared memory goes
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
EncodeTiled encode_tiled() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      throw std::runtime_error("cutlassfuse: the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// A rank-3 map of 16-bit elements with 128-byte swizzled boxes; dims and box innermost
// first, strides in bytes of dims 1 and 2.
CUtensorMap tensor_map(CUtensorMapDataType type, const void* base, const cuuint64_t (&dims)[3],
                       const cuuint64_t (&strides)[2], const cuuint32_t (&box)[3]) {
  CUtensorMap map;
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result = encode_tiled()(&map, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                         CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error("cutlassfuse: cuTensorMapEncodeTiled failed (" + std::to_string(result) + ")");
  }
  return map;
}

// The largest dynamic shared memory a block asks for, over the channel counts taken.
constexpr int kMaxSmemBytes = [] {
  int bytes = 0;
  for (int c = kChannelsPerBox; c <= kMaxBulkChannels; c += kChannelsPerBox)
    bytes = std::max(bytes, smem_bytes(c, chunks_per_strip(c)));
  return bytes;
}();

// Once per kernel and device (a driver call costs microseconds of host time per call):
// the opt-in beyond 48 KB of dynamic shared memory, for every size a launch may use.
template <class T>
void allow_max_smem() {
  constexpr int kDevices = 64;
  static std::atomic<bool> allowed[kDevices] = {};  // per element type: one per kernel
  int device = 0;
  if (cudaGetDevice(&device) == cudaSuccess && device < kDevices && allowed[device].load(std::memory_order_relaxed))
    return;
  if (const cudaError_t e = cudaFuncSetAttribute(group_norm_finish_bulk_kernel<T>,
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
      e != cudaSuccess) {
    throw std::runtime_error(std::string("cutlassfuse: group_norm_finish_bulk_kernel's shared memory: ") +
                             cudaGetErrorString(e));
  }
  if (device < kDevices) allowed[device].store(true, std::memory_order_relaxed);
}

template <class T>
void launch(const StatisticsFinalize& finalize, const BulkFinishJob& job, cudaStream_t stream) {
  allow_max_smem<T>();
  const auto blocks = static_cast<unsigned>(finalize.batch * (finalize.num_groups + job.blocks_per_sample));
  group_norm_finish_bulk_kernel<T>
      <<<blocks, kThreads, smem_bytes(finalize.channels, job.chunks), stream>>>(finalize, job);
  check_launch("group_norm_finish_bulk_kernel");
}

}  // namespace

bool group_norm_finish_bulk_takes(ElementType element, int64_t channels, int64_t spatial, const void* activation,
                                  const void* output) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return element != ElementType::kFloat32 && channels % kChannelsPerBox == 0 && channels <= kMaxBulkChannels &&
         spatial % 8 == 0 && spatial < (int64_t{1} << 31) && aligned(activation) && aligned(output);
}

void group_norm_finish_bulk(const StatisticsFinalize& finalize, int* groups_finalized, const void* activation,
                            int64_t spatial, void* output, cudaStream_t stream) {
  const auto type =
      finalize.element == ElementType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const auto c = static_cast<cuuint64_t>(finalize.channels), p = static_cast<cuuint64_t>(spatial),
             n = static_cast<cuuint64_t>(finalize.batch);
  BulkFinishJob job{};
  job.activation = tensor_map(type, activation, {c, p, n}, {c * 2, p * c * 2}, {kChannelsPerBox, kPixels, 1});
  job.output = output;
  job.spatial = static_cast<int>(spatial);
  job.groups_finalized = groups_finalized;
  job.chunks = chunks_per_strip(finalize.channels);
  job.blocks_per_sample = static_cast<int>(ceil_div(static_cast<int64_t>(p), int64_t{kPixels} * job.chunks));
  if (finalize.element == ElementType::kFloat16) {
    launch<__half>(finalize, job, stream);
  } else {
    launch<__nv_bfloat16>(finalize, job, stream);
  }
}

}  // namespace cutlassfuse
