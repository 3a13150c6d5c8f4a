// NCDHW <-> NDHWC through shared-memory tiles, and row repetition. See cutlassfuse/common/layout.h.
#include <algorithm>
#include <cstdint>
#include <string>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/plan/float32_split.h"
#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/tf32_scaling.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // kTile spatial positions x kTile channels per block iteration

// Block (spatial tile, channel tile, n). Reads: 16-byte vectors of 8 spatial positions
// of one channel when the rows allow it (a warp covers 4 channels x 128 contiguous
// bytes), else one element per lane (a warp covers 64 contiguous bytes): 2-byte loads
// leave a third of the bandwidth unused. Writes:
// 16-byte vectors along the channels, 8 lanes covering one 128-byte row of a spatial
// position.
template <class T, bool kVectorLoads>
__global__ void __launch_bounds__(kThreads)
ncdhw_to_ndhwc_kernel(const T* __restrict__ src, T* __restrict__ dst, int channels, int64_t spatial) {
  __shared__ T tile[kTile][kTile + 2];  // [s][c]; +2 elements keeps the transposed writes off one bank
  const int64_t n = blockIdx.z;
  const int64_t s_begin = blockIdx.x * int64_t{kTile};
  const int c_begin = blockIdx.y * kTile;
  const int s_count = static_cast<int>(min(spatial - s_begin, int64_t{kTile}));
  const int c_count = min(kTile, channels - c_begin);
  const T* src_tile = src + (n * channels + c_begin) * spatial + s_begin;

  if constexpr (kVectorLoads) {
    // spatial % kVector == 0, so s_count is a whole number of vectors.
    constexpr int kVectorsPerChannel = kTile / kVector;  // 8
    const int load_s = (threadIdx.x % kVectorsPerChannel) * kVector;
    if (load_s < s_count) {
      for (int c = threadIdx.x / kVectorsPerChannel; c < c_count; c += kThreads / kVectorsPerChannel) {
        const uint4 raw = *reinterpret_cast<const uint4*>(src_tile + c * spatial + load_s);
        const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int k = 0; k < kVector; ++k) tile[load_s + k][c] = elems[k];
      }
    }
  } else {
    const int load_s = threadIdx.x % kTile;
    if (load_s < s_count) {
      for (int c = threadIdx.x / kTile; c < c_count; c += kThreads / kTile) {
        tile[load_s][c] = src_tile[c * spatial + load_s];
      }
    }
  }
  __syncthreads();

  constexpr int kVectorsPerRow = kTile / kVector;  // 8
  const int store_c = (threadIdx.x % kVectorsPerRow) * kVector;
  if (store_c < c_count) {
    for (int s = threadIdx.x / kVectorsPerRow; s < s_count; s += kThreads / kVectorsPerRow) {
      uint4 raw;
      T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVector; ++k) elems[k] = tile[s][store_c + k];
      *reinterpret_cast<uint4*>(dst + (n * spatial + s_begin + s) * channels + c_begin + store_c) = raw;
    }
  }
}

// The inverse, NDHWC -> NCDHW, block (spatial tile, channel tile, n). Reads: 16-byte
// vectors along the channels (8 lanes per 128-byte row of a spatial position). Writes:
// 16-byte vectors of 8 spatial positions of one channel when the rows allow it, else one
// element per lane.
template <class T, bool kVectorStores>
__global__ void __launch_bounds__(kThreads)
ndhwc_to_ncdhw_kernel(const T* __restrict__ src, T* __restrict__ dst, int channels, int64_t spatial) {
  __shared__ T tile[kTile][kTile + 2];  // [s][c]
  const int64_t n = blockIdx.z;
  const int64_t s_begin = blockIdx.x * int64_t{kTile};
  const int c_begin = blockIdx.y * kTile;
  const int s_count = static_cast<int>(min(spatial - s_begin, int64_t{kTile}));
  const int c_count = min(kTile, channels - c_begin);

  constexpr int kVectorsPerRow = kTile / kVector;  // 8
  const int load_c = (threadIdx.x % kVectorsPerRow) * kVector;
  if (load_c < c_count) {
    for (int s = threadIdx.x / kVectorsPerRow; s < s_count; s += kThreads / kVectorsPerRow) {
      const uint4 raw =
          *reinterpret_cast<const uint4*>(src + (n * spatial + s_begin + s) * channels + c_begin + load_c);
      const T* elems = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVector; ++k) tile[s][load_c + k] = elems[k];
    }
  }
  __syncthreads();

  T* dst_tile = dst + (n * channels + c_begin) * spatial + s_begin;
  if constexpr (kVectorStores) {
    constexpr int kVectorsPerChannel = kTile / kVector;  // 8
    const int store_s = (threadIdx.x % kVectorsPerChannel) * kVector;
    if (store_s < s_count) {
      for (int c = threadIdx.x / kVectorsPerChannel; c < c_count; c += kThreads / kVectorsPerChannel) {
        uint4 raw;
        T* elems = reinterpret_cast<T*>(&raw);
#pragma unroll
        for (int k = 0; k < kVector; ++k) elems[k] = tile[store_s + k][c];
        *reinterpret_cast<uint4*>(dst_tile + c * spatial + store_s) = raw;
      }
    }
  } else {
    const int store_s = threadIdx.x % kTile;
    if (store_s < s_count) {
      for (int c = threadIdx.x / kTile; c < c_count; c += kThreads / kTile) {
        dst_tile[c * spatial + store_s] = tile[store_s][c];
      }
    }
  }
}

// A block's extent: (spatial tile, channel tile, n) of tile_grid.
struct BlockTile {
  int64_t n, s_begin;
  int c_begin, s_count, c_count;

  __device__ BlockTile(int channels, int64_t spatial)
      : n(blockIdx.z), s_begin(blockIdx.x * int64_t{kTile}), c_begin(blockIdx.y * kTile),
        s_count(static_cast<int>(min(spatial - s_begin, int64_t{kTile}))), c_count(min(kTile, channels - c_begin)) {}
};

// How a float32 tile kernel reads its source: NDHWC, or NCDHW one element per lane, or
// NCDHW in 16-byte vectors of 4 spatial positions (rows of whole, aligned vectors).
enum class FloatSource { kChannelsLast, kNcdhw, kNcdhwVectors };

// Loads a float32 block tile [s][c] of a block (spatial tile, channel tile, n), along
// the source's contiguous dimension: a warp covers 128 bytes of a row, or with vectors
// 256 bytes of each of two channel rows.
template <FloatSource kSource>
__device__ __forceinline__ void load_float_tile(const float* __restrict__ src, float (*tile)[kTile + 1], int channels,
                                                int64_t spatial, const BlockTile& b) {
  if constexpr (kSource == FloatSource::kNcdhwVectors) {
    constexpr int kVectorsPerChannel = kTile / 4;  // 16
    const int load_s = (threadIdx.x % kVectorsPerChannel) * 4;
    if (load_s >= b.s_count) return;  // s_count is a whole number of vectors
    for (int c = threadIdx.x / kVectorsPerChannel; c < b.c_count; c += kThreads / kVectorsPerChannel) {
      const float4 v =
          *reinterpret_cast<const float4*>(src + (b.n * channels + b.c_begin + c) * spatial + b.s_begin + load_s);
      tile[load_s][c] = v.x;
      tile[load_s + 1][c] = v.y;
      tile[load_s + 2][c] = v.z;
      tile[load_s + 3][c] = v.w;
    }
    return;
  }
  constexpr bool kChannelsLast = kSource == FloatSource::kChannelsLast;
  const int inner = threadIdx.x % kTile;  // along the source's contiguous dimension
  for (int outer = threadIdx.x / kTile; outer < (kChannelsLast ? b.s_count : b.c_count); outer += kThreads / kTile) {
    if constexpr (kChannelsLast) {
      if (inner < b.c_count)
        tile[outer][inner] = src[(b.n * spatial + b.s_begin + outer) * channels + b.c_begin + inner];
    } else {
      if (inner < b.s_count)
        tile[inner][outer] = src[(b.n * channels + b.c_begin + outer) * spatial + b.s_begin + inner];
    }
  }
}

// v's bfloat16 pieces (float32_split.h): piece k is the rest after the pieces before it.
__device__ __forceinline__ void split_into_pieces(float v, __nv_bfloat16 (&pieces)[float32_split::kPieces]) {
#pragma unroll
  for (int piece = 0; piece < float32_split::kPieces; ++piece) {
    pieces[piece] = __float2bfloat16_rn(v);
    v -= __bfloat162float(pieces[piece]);
    // A non-finite value is all in its first piece (inf - inf would make the rest NaN).
    if (!isfinite(v)) v = 0.f;
  }
}

// Block (spatial tile, channel tile, n), as above, reading float32 (through the tile
// when the source is NCDHW) and writing, per 8 channels of a pixel, one 16-byte
// bfloat16 vector into each of the kProducts channel blocks (float32_split.h).
template <FloatSource kSource>
__global__ void __launch_bounds__(kThreads)
split_float32_kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int channels, int64_t spatial) {
  __shared__ float tile[kTile][kTile + 1];  // [s][c]; +1 keeps the transposed accesses off one bank
  const BlockTile b(channels, spatial);
  load_float_tile<kSource>(src, tile, channels, spatial, b);
  __syncthreads();

  using namespace float32_split;
  constexpr int kVectorsPerRow = kTile / kVector;
  const int store_c = (threadIdx.x % kVectorsPerRow) * kVector;
  if (store_c >= b.c_count) return;
  for (int s = threadIdx.x / kVectorsPerRow; s < b.s_count; s += kThreads / kVectorsPerRow) {
    uint4 raw[kPieces];
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      __nv_bfloat16 pieces[kPieces];
      split_into_pieces(tile[s][store_c + k], pieces);
#pragma unroll
      for (int piece = 0; piece < kPieces; ++piece) reinterpret_cast<__nv_bfloat16*>(&raw[piece])[k] = pieces[piece];
    }
    __nv_bfloat16* row = dst + (b.n * spatial + b.s_begin + s) * kProducts * channels + b.c_begin + store_c;
#pragma unroll
    for (int block = 0; block < kProducts; ++block) {
      *reinterpret_cast<uint4*>(row + block * channels) = raw[input_piece(block)];
    }
  }
}

// One value a thread (grid-stride): its pieces into each of the kProducts blocks of
// numel values.
__global__ void __launch_bounds__(kThreads)
split_float32_blocks_kernel(const float* __restrict__ src, int64_t numel, __nv_bfloat16* __restrict__ dst) {
  using namespace float32_split;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < numel; i += int64_t{gridDim.x} * kThreads) {
    __nv_bfloat16 pieces[kPieces];
    split_into_pieces(src[i], pieces);
#pragma unroll
    for (int block = 0; block < kProducts; ++block) dst[block * numel + i] = pieces[filter_piece(block)];
  }
}

// Block (spatial tile, channel tile, n), as above, writing each pixel's channels
// scaled by 2^e_input and rounded to nearest float16 (tf32_scaling.h), 8 channels
// (16 bytes) per store.
template <FloatSource kSource>
__global__ void __launch_bounds__(kThreads)
scale_tf32_kernel(const float* __restrict__ src, __half* __restrict__ dst, int channels, int64_t spatial,
                  const Tf32OperandScales* __restrict__ scales) {
  __shared__ float tile[kTile][kTile + 1];  // [s][c]
  const BlockTile b(channels, spatial);
  load_float_tile<kSource>(src, tile, channels, spatial, b);
  const PowerOfTwo scale(tf32_scale_exponents(scales->input_max_bits, scales->filter_max_bits).input);
  __syncthreads();

  constexpr int kVectorsPerRow = kTile / kVector;  // 8
  const int store_c = (threadIdx.x % kVectorsPerRow) * kVector;
  if (store_c >= b.c_count) return;
  for (int s = threadIdx.x / kVectorsPerRow; s < b.s_count; s += kThreads / kVectorsPerRow) {
    uint4 raw;
    __half* elems = reinterpret_cast<__half*>(&raw);
#pragma unroll
    for (int k = 0; k < kVector; ++k) elems[k] = __float2half_rn(scale.times(tile[s][store_c + k]));
    *reinterpret_cast<uint4*>(dst + (b.n * spatial + b.s_begin + s) * channels + b.c_begin + store_c) = raw;
  }
}

// Byte by byte: rows are a bias (at most a few KB in all), whose pointer may be any view.
__global__ void __launch_bounds__(kThreads)
repeat_row_kernel(const unsigned char* __restrict__ row, int64_t row_bytes, int64_t total_bytes,
                  unsigned char* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < total_bytes; i += int64_t{gridDim.x} * kThreads) {
    dst[i] = row[i % row_bytes];
  }
}

// One 16-byte vector of kVector output channels a thread (grid-stride), the source's
// values for the channels it has and zeros after them; consecutive threads take
// consecutive vectors of a pixel, then consecutive pixels, so the stores are contiguous
// and the loads of a one-channel NCDHW source are too.
template <class T>
__global__ void __launch_bounds__(kThreads)
pad_channels_ndhwc_kernel(const T* __restrict__ src, bool channels_last_source, T* __restrict__ dst, int channels,
                          int padded_channels, int64_t spatial, int64_t vectors) {
  const int vectors_per_pixel = padded_channels / kVector;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < vectors; i += int64_t{gridDim.x} * kThreads) {
    const int64_t pixel = i / vectors_per_pixel;  // n * spatial + s
    const int c0 = static_cast<int>(i - pixel * vectors_per_pixel) * kVector;
    const int64_t n = pixel / spatial;
    const int64_t s = pixel - n * spatial;
    float v[kVector];
#pragma unroll
    for (int k = 0; k < kVector; ++k) {
      const int c = c0 + k;
      v[k] = c >= channels
                 ? 0.f
                 : to_float(channels_last_source ? src[pixel * channels + c] : src[(n * channels + c) * spatial + s]);
    }
    store_vector(dst + i * kVector, v);
  }
}

dim3 tile_grid(int64_t batch, int64_t channels, int64_t spatial) {
  return dim3(static_cast<unsigned>(ceil_div(spatial, kTile)), static_cast<unsigned>(ceil_div(channels, kTile)),
              static_cast<unsigned>(batch));
}

void check_shape(const char* what, int64_t batch, int64_t channels) {
  if (channels % kVector != 0)
    throw std::invalid_argument(std::string("cutlassfuse: ") + what + " needs channels % 8 == 0");
  if (batch > 65535) throw std::invalid_argument(std::string("cutlassfuse: ") + what + " takes at most 65535 samples");
}

// The NCDHW side's rows take 16-byte vectors when they hold whole vectors and start aligned.
bool vector_rows(const void* ncdhw, int64_t spatial) {
  return spatial % kVector == 0 && reinterpret_cast<uintptr_t>(ncdhw) % sizeof(uint4) == 0;
}

template <class T, bool kToChannelsLast>
void launch_transpose(const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial,
                      cudaStream_t stream) {
  using Kernel = void (*)(const T*, T*, int, int64_t);
  const bool vectors = vector_rows(kToChannelsLast ? src : dst, spatial);
  Kernel kernel;
  if constexpr (kToChannelsLast) {
    kernel = vectors ? ncdhw_to_ndhwc_kernel<T, true> : ncdhw_to_ndhwc_kernel<T, false>;
  } else {
    kernel = vectors ? ndhwc_to_ncdhw_kernel<T, true> : ndhwc_to_ncdhw_kernel<T, false>;
  }
  kernel<<<tile_grid(batch, channels, spatial), kThreads, 0, stream>>>(static_cast<const T*>(src), static_cast<T*>(dst),
                                                                       static_cast<int>(channels), spatial);
  check_launch(kToChannelsLast ? "ncdhw_to_ndhwc_kernel" : "ndhwc_to_ncdhw_kernel");
}

template <bool kToChannelsLast>
void transpose(const char* what, ElementType element, const void* src, void* dst, int64_t batch, int64_t channels,
               int64_t spatial, cudaStream_t stream) {
  check_shape(what, batch, channels);
  switch (element) {
    case ElementType::kFloat16:
      return launch_transpose<__half, kToChannelsLast>(src, dst, batch, channels, spatial, stream);
    case ElementType::kBFloat16:
      return launch_transpose<__nv_bfloat16, kToChannelsLast>(src, dst, batch, channels, spatial, stream);
    default: throw std::invalid_argument(std::string("cutlassfuse: ") + what + " takes float16 or bfloat16");
  }
}

}  // namespace

void ncdhw_to_ndhwc(ElementType element, const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial,
                    cudaStream_t stream) {
  transpose<true>("ncdhw_to_ndhwc", element, src, dst, batch, channels, spatial, stream);
}

void ndhwc_to_ncdhw(ElementType element, const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial,
                    cudaStream_t stream) {
  transpose<false>("ndhwc_to_ncdhw", element, src, dst, batch, channels, spatial, stream);
}

void pad_channels_ndhwc(ElementType element, const void* src, bool channels_last_source, void* dst, int64_t batch,
                        int64_t channels, int64_t padded_channels, int64_t spatial, cudaStream_t stream) {
  if (padded_channels % kVector != 0 || padded_channels < channels)
    throw std::invalid_argument(
        "cutlassfuse: pad_channels_ndhwc pads to a multiple of 8 channels, at least the source's");
  const int64_t vectors = batch * spatial * (padded_channels / kVector);
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(vectors, kThreads), 65535));
  const auto launch = [&](auto typed) {
    using T = decltype(typed);
    pad_channels_ndhwc_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(src), channels_last_source,
                                                                  static_cast<T*>(dst), static_cast<int>(channels),
                                                                  static_cast<int>(padded_channels), spatial, vectors);
  };
  switch (element) {
    case ElementType::kFloat16: launch(__half{}); break;
    case ElementType::kBFloat16: launch(__nv_bfloat16{}); break;
    default: throw std::invalid_argument("cutlassfuse: pad_channels_ndhwc takes float16 or bfloat16");
  }
  check_launch("pad_channels_ndhwc_kernel");
}

void repeat_row(const void* row, int64_t row_bytes, int64_t copies, void* dst, cudaStream_t stream) {
  const int64_t total = row_bytes * copies;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div(total, kThreads), 1024));
  repeat_row_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const unsigned char*>(row), row_bytes, total,
                                                     static_cast<unsigned char*>(dst));
  check_launch("repeat_row_kernel");
}

// A float32 tile kernel (Kernel<FloatSource>) over tile_grid, reading NCDHW rows in
// vectors where they hold whole, aligned ones.
template <class Out, template <FloatSource> class Kernel, class... Extra>
void launch_float_tiles(const char* what, const void* src, bool channels_last_source, void* dst, int64_t batch,
                        int64_t channels, int64_t spatial, cudaStream_t stream, Extra... extra) {
  check_shape(what, batch, channels);
  const bool vectors = spatial % 4 == 0 && reinterpret_cast<uintptr_t>(src) % sizeof(float4) == 0;
  const auto kernel = channels_last_source ? Kernel<FloatSource::kChannelsLast>::function
                      : vectors            ? Kernel<FloatSource::kNcdhwVectors>::function
                                           : Kernel<FloatSource::kNcdhw>::function;
  kernel<<<tile_grid(batch, channels, spatial), kThreads, 0, stream>>>(
      static_cast<const float*>(src), static_cast<Out*>(dst), static_cast<int>(channels), spatial, extra...);
  check_launch(what);
}

template <FloatSource kSource>
struct SplitFloat32 {
  static constexpr auto function = split_float32_kernel<kSource>;
};
template <FloatSource kSource>
struct ScaleTf32 {
  static constexpr auto function = scale_tf32_kernel<kSource>;
};

void split_float32_ndhwc(const void* src, bool channels_last_source, void* dst, int64_t batch, int64_t channels,
                         int64_t spatial, cudaStream_t stream) {
  launch_float_tiles<__nv_bfloat16, SplitFloat32>("split_float32_kernel", src, channels_last_source, dst, batch,
                                                  channels, spatial, stream);
}

void split_float32_filter(const void* src, int64_t numel, void* dst, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>(ceil_div(numel, kThreads), 1, 65535));
  split_float32_blocks_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src), numel,
                                                               static_cast<__nv_bfloat16*>(dst));
  check_launch("split_float32_blocks_kernel");
}

void scale_tf32_ndhwc(const void* src, bool channels_last_source, const Tf32OperandScales* scales, void* dst,
                      int64_t batch, int64_t channels, int64_t spatial, cudaStream_t stream) {
  launch_float_tiles<__half, ScaleTf32>("scale_tf32_kernel", src, channels_last_source, dst, batch, channels, spatial,
                                        stream, scales);
}

}  // namespace cutlassfuse
