// Replicate padding of packed 5-D tensors. See cutlassfuse/common/replication_pad.h.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/replication_pad.h"

namespace cutlassfuse {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops over at most this many blocks: enough to fill the GPU many times.
constexpr int64_t kMaxBlocks = 8192;
// NDHWC: units a thread copies per iteration, their loads in flight together.
constexpr int kUnits = 4;

// The type of kBytes bytes (1, 2, 4, 8 or 16): what the copy moves.
template <int kBytes>
using BitsOf =
    std::tuple_element_t<std::countr_zero(unsigned{kBytes}), std::tuple<uint8_t, uint16_t, uint32_t, uint2, uint4>>;

__device__ __forceinline__ uint32_t clamped(int64_t index, uint32_t extent) {
  return static_cast<uint32_t>(index < 0 ? 0 : index >= extent ? extent - 1 : index);
}

// The output's indices over the input's: the input row or pixel that an output row or
// pixel copies. 32-bit: replication_pad3d_takes bounds both tensors' elements.
struct PadGrid {
  FastDivisor out_w, out_h, out_d;
  uint32_t row_length;  // the output's W
  uint32_t in_d, in_h, in_w;
  int32_t front, top, left;

  explicit PadGrid(const ReplicationPad3d& p)
      : out_w(static_cast<uint32_t>(p.output(2))), out_h(static_cast<uint32_t>(p.output(1))),
        out_d(static_cast<uint32_t>(p.output(0))), row_length(static_cast<uint32_t>(p.output(2))),
        in_d(static_cast<uint32_t>(p.input[0])), in_h(static_cast<uint32_t>(p.input[1])),
        in_w(static_cast<uint32_t>(p.input[2])), front(static_cast<int32_t>(p.before[0])),
        top(static_cast<int32_t>(p.before[1])), left(static_cast<int32_t>(p.before[2])) {}

  // The input row of output row `row`, rows indexed (plane, d, h) with plane n * C + c
  // (NCDHW) or n (NDHWC).
  __device__ __forceinline__ uint32_t source_row(uint32_t row) const {
    const uint32_t plane_d = out_h.quotient(row);
    const uint32_t h = out_h.remainder(row, plane_d);
    const uint32_t plane = out_d.quotient(plane_d);
    const uint32_t d = out_d.remainder(plane_d, plane);
    return (plane * in_d + clamped(int64_t{d} - front, in_d)) * in_h + clamped(int64_t{h} - top, in_h);
  }

  __device__ __forceinline__ uint32_t source_w(uint32_t w) const { return clamped(int64_t{w} - left, in_w); }

  // The input pixel of NDHWC output pixel `pixel`.
  __device__ __forceinline__ uint32_t source_pixel(uint32_t pixel) const {
    const uint32_t row = out_w.quotient(pixel);
    return source_row(row) * in_w + source_w(out_w.remainder(pixel, row));
  }
};

// NDHWC: kUnits Units of output pixels' channels a thread, kThreads apart (coalesced),
// each copied from its source pixel; all loads in flight before the stores.
template <class Unit>
__global__ void __launch_bounds__(kThreads)
replication_pad_ndhwc_kernel(const Unit* __restrict__ src, Unit* __restrict__ dst, const PadGrid grid,
                             const FastDivisor pixel_units, uint32_t units_per_pixel, uint32_t total_units) {
  const uint32_t stride = gridDim.x * kThreads * kUnits;
  for (uint32_t first = blockIdx.x * kThreads * kUnits + threadIdx.x; first < total_units; first += stride) {
    Unit loaded[kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const uint32_t i = first + u * kThreads;
      if (i >= total_units) break;
      const uint32_t pixel = pixel_units.quotient(i);
      const uint32_t unit = pixel_units.remainder(i, pixel);
      loaded[u] = src[static_cast<uint64_t>(grid.source_pixel(pixel)) * units_per_pixel + unit];
    }
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const uint32_t i = first + u * kThreads;
      if (i < total_units) dst[i] = loaded[u];
    }
  }
}

// NCDHW: 16 bytes of the output a thread (kChunk elements, rows running on across
// chunks), its elements read one by one from their source rows, all in flight before
// one 16-byte store (kVectorStore: dst 16-byte aligned) or, for the last, partial chunk,
// element stores.
template <class Element, bool kVectorStore>
__global__ void __launch_bounds__(kThreads)
replication_pad_ncdhw_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const PadGrid grid,
                             uint32_t total) {
  constexpr int kChunk = sizeof(uint4) / sizeof(Element);
  union Chunk {
    uint4 vector;
    Element elements[kChunk];
  };
  const uint32_t chunks = total / kChunk + (total % kChunk != 0);
  const uint32_t stride = gridDim.x * kThreads;
  for (uint32_t c = blockIdx.x * kThreads + threadIdx.x; c < chunks; c += stride) {
    const uint32_t first = c * kChunk;
    const bool whole = total - first >= kChunk;
    uint32_t row = grid.out_w.quotient(first);
    uint32_t w = grid.out_w.remainder(first, row);
    uint64_t source = static_cast<uint64_t>(grid.source_row(row)) * grid.in_w;
    Chunk chunk;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (!whole && first + k >= total) break;
      chunk.elements[k] = src[source + grid.source_w(w)];
      if (++w == grid.row_length && k + 1 < kChunk) {
        w = 0;
        source = static_cast<uint64_t>(grid.source_row(++row)) * grid.in_w;
      }
    }
    if (kVectorStore && whole) {
      *reinterpret_cast<uint4*>(dst + first) = chunk.vector;
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        if (first + k < total) dst[first + k] = chunk.elements[k];
    }
  }
}

unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(threads, kThreads), 1, kMaxBlocks));
}

// The widest unit (bytes, a power of two up to 16) that divides the pixel's bytes and
// both pointers' addresses.
int unit_bytes(int64_t pixel_bytes, const void* src, const void* dst) {
  const auto alignment = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  int bytes = 16;
  while (bytes > 1 && (pixel_bytes % bytes != 0 || alignment % bytes != 0)) bytes /= 2;
  return bytes;
}

template <int kBytes>
void launch_ndhwc(const void* src, void* dst, const ReplicationPad3d& p, int64_t pixel_bytes, cudaStream_t stream) {
  using Unit = BitsOf<kBytes>;
  const auto units_per_pixel = static_cast<uint32_t>(pixel_bytes / kBytes);
  const int64_t total = p.output_elements() / p.channels * units_per_pixel;
  // Units are at least elements wide where the pointers are aligned to their elements.
  if (total > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("cutlassfuse: replication_pad3d takes pointers aligned to their elements");
  replication_pad_ndhwc_kernel<Unit><<<blocks_for(ceil_div(total, kUnits)), kThreads, 0, stream>>>(
      static_cast<const Unit*>(src), static_cast<Unit*>(dst), PadGrid(p), FastDivisor(units_per_pixel), units_per_pixel,
      static_cast<uint32_t>(total));
  check_launch("replication_pad_ndhwc_kernel");
}

template <int kBytes>
void launch_ncdhw(const void* src, void* dst, const ReplicationPad3d& p, cudaStream_t stream) {
  using Element = BitsOf<kBytes>;
  const int64_t total = p.output_elements();
  const auto kernel = reinterpret_cast<uintptr_t>(dst) % sizeof(uint4) == 0
                          ? replication_pad_ncdhw_kernel<Element, true>
                          : replication_pad_ncdhw_kernel<Element, false>;
  kernel<<<blocks_for(ceil_div(total, sizeof(uint4) / kBytes)), kThreads, 0, stream>>>(
      static_cast<const Element*>(src), static_cast<Element*>(dst), PadGrid(p), static_cast<uint32_t>(total));
  check_launch("replication_pad_ncdhw_kernel");
}

// f(std::integral_constant<int, bytes>) for bytes in 1, 2, 4, 8, 16.
template <class F>
void with_bytes(int64_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default:
      throw std::invalid_argument("cutlassfuse: replication_pad3d copies elements of 1, 2, 4, 8 or 16 bytes, not " +
                                  std::to_string(bytes));
  }
}

}  // namespace

bool replication_pad3d_takes(const ReplicationPad3d& p, int64_t element_bytes) {
  // 32-bit indices, and loops whose index stays below 2^32 as it strides past the end.
  constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8 && element_bytes != 16)
    return false;
  if (p.batch < 1 || p.channels < 1) return false;
  for (int dim = 0; dim < 3; ++dim) {
    if (p.input[dim] < 1 || p.before[dim] < 0 || p.after[dim] < 0 || p.output(dim) > kMaxElements) return false;
  }
  return p.input_elements() <= kMaxElements && p.output_elements() <= kMaxElements;
}

void replication_pad3d(const void* src, void* dst, int64_t element_bytes, bool channels_last, const ReplicationPad3d& p,
                       cudaStream_t stream) {
  if (!replication_pad3d_takes(p, element_bytes))
    throw std::invalid_argument(
        "cutlassfuse: replication_pad3d takes non-empty tensors of up to 2^31 - 1 "
        "elements and non-negative pads");
  if (channels_last) {
    const int64_t pixel_bytes = p.channels * element_bytes;
    with_bytes(unit_bytes(pixel_bytes, src, dst),
               [&](auto bytes) { launch_ndhwc<decltype(bytes)::value>(src, dst, p, pixel_bytes, stream); });
  } else {
    with_bytes(element_bytes, [&](auto bytes) { launch_ncdhw<decltype(bytes)::value>(src, dst, p, stream); });
  }
}

}  // namespace cutlassfuse
