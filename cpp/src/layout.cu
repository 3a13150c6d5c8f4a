// NCDHW -> NDHWC through shared-memory tiles. See cutlassfuse/layout.h.
#include "cutlassfuse/device_utils.cuh"
#include "cutlassfuse/layout.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;  // kTile spatial positions x kTile channels per block iteration

// Block (spatial tile, channel tile, n). Reads: a warp takes 32 consecutive spatial
// positions of one channel (64 contiguous bytes). Writes: 16-byte vectors along the
// channels, 8 lanes covering one 128-byte row of a spatial position.
template <class T>
__global__ void __launch_bounds__(kThreads)
ncdhw_to_ndhwc_kernel(const T* __restrict__ src, T* __restrict__ dst, int channels, int64_t spatial) {
  __shared__ T tile[kTile][kTile + 2];  // [s][c]; +2 elements keeps the transposed writes off one bank
  const int64_t n = blockIdx.z;
  const int64_t s_begin = blockIdx.x * int64_t{kTile};
  const int c_begin = blockIdx.y * kTile;
  const int s_count = static_cast<int>(min(spatial - s_begin, int64_t{kTile}));
  const int c_count = min(kTile, channels - c_begin);

  const int load_s = threadIdx.x % kTile;
  if (load_s < s_count) {
    for (int c = threadIdx.x / kTile; c < c_count; c += kThreads / kTile) {
      tile[load_s][c] = src[(n * channels + c_begin + c) * spatial + s_begin + load_s];
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

template <class T>
void launch(const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(spatial, kTile)), static_cast<unsigned>(ceil_div(channels, kTile)),
                  static_cast<unsigned>(batch));
  ncdhw_to_ndhwc_kernel<T><<<grid, kThreads, 0, stream>>>(static_cast<const T*>(src), static_cast<T*>(dst),
                                                          static_cast<int>(channels), spatial);
  check_launch("ncdhw_to_ndhwc_kernel");
}

}  // namespace

void ncdhw_to_ndhwc(ElementType element, const void* src, void* dst, int64_t batch, int64_t channels,
                    int64_t spatial, cudaStream_t stream) {
  if (channels % kVector != 0) throw std::invalid_argument("cutlassfuse: ncdhw_to_ndhwc needs channels % 8 == 0");
  if (batch > 65535) throw std::invalid_argument("cutlassfuse: ncdhw_to_ndhwc takes at most 65535 samples");
  switch (element) {
    case ElementType::kFloat16: return launch<__half>(src, dst, batch, channels, spatial, stream);
    case ElementType::kBFloat16: return launch<__nv_bfloat16>(src, dst, batch, channels, spatial, stream);
    default: throw std::invalid_argument("cutlassfuse: ncdhw_to_ndhwc takes float16 or bfloat16");
  }
}

}  // namespace cutlassfuse
