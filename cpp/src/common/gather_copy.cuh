// Copies that move bits: every output element (NCDHW), or every output pixel's channels
// (NDHWC), copied from the input element or pixel that an index map names. The
// replicate pad and nearest upsampling are such copies (replication_pad.cu,
// upsample_nearest.cu); one kernel per element size serves every dtype of that size.
//
// A Map describes a packed 5-D output over a packed 5-D input, 32-bit indices:
//   out_w       FastDivisor of the output's W;
//   row_length  the output's W;  in_w  the input's W;
//   source_row(row)  the input row (plane, d, h) of output row `row`, rows indexed
//                    (plane, d, h) with plane n * C + c (NCDHW) or n (NDHWC);
//   source_w(w)      the input column of output column `w`.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "cutlassfuse/common/device_utils.cuh"

namespace cutlassfuse::gather_copy {

constexpr int kThreads = 256;
// Grid-stride loops over at most this many blocks: enough to fill the GPU many times.
constexpr int64_t kMaxBlocks = 8192;
// NDHWC: units a thread copies per iteration, their loads in flight together.
constexpr int kUnits = 4;

// The type of kBytes bytes (1, 2, 4, 8 or 16): what the copy moves.
template <int kBytes>
using BitsOf =
    std::tuple_element_t<std::countr_zero(unsigned{kBytes}), std::tuple<uint8_t, uint16_t, uint32_t, uint2, uint4>>;

// An output row's (plane, d, h).
struct RowCoordinates {
  uint32_t plane, d, h;
};

// The extents a Map indexes: the output's D, H, W (W twice: a divisor and a length) and
// the input's, 32-bit.
struct Extents {
  FastDivisor out_w, out_h, out_d;
  uint32_t row_length;  // the output's W
  uint32_t in_d, in_h, in_w;

  Extents(const int64_t (&input)[3], const int64_t (&output)[3])
      : out_w(static_cast<uint32_t>(output[2])), out_h(static_cast<uint32_t>(output[1])),
        out_d(static_cast<uint32_t>(output[0])), row_length(static_cast<uint32_t>(output[2])),
        in_d(static_cast<uint32_t>(input[0])), in_h(static_cast<uint32_t>(input[1])),
        in_w(static_cast<uint32_t>(input[2])) {}

  __device__ __forceinline__ RowCoordinates row_coordinates(uint32_t row) const {
    const uint32_t plane_d = out_h.quotient(row);
    const uint32_t plane = out_d.quotient(plane_d);
    return {plane, out_d.remainder(plane_d, plane), out_h.remainder(row, plane_d)};
  }
};

// The input pixel of NDHWC output pixel `pixel`.
template <class Map>
__device__ __forceinline__ uint32_t source_pixel(const Map& map, uint32_t pixel) {
  const uint32_t row = map.out_w.quotient(pixel);
  return map.source_row(row) * map.in_w + map.source_w(map.out_w.remainder(pixel, row));
}

// NDHWC: kUnits Units of output pixels' channels a thread, kThreads apart (coalesced),
// each copied from its source pixel; all loads in flight before the stores.
template <class Map, class Unit>
__global__ void __launch_bounds__(kThreads)
channels_last_gather_kernel(const Unit* __restrict__ src, Unit* __restrict__ dst, const Map map,
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
      loaded[u] = src[static_cast<uint64_t>(source_pixel(map, pixel)) * units_per_pixel + unit];
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
// one 16-byte store (dst_aligned) or element stores. The load pipeline bounds it (a load
// instruction per element): about half a copy's speed.
template <class Map, class Element>
__global__ void __launch_bounds__(kThreads)
channels_first_gather_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const Map map, uint32_t total,
                             bool dst_aligned) {
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
    uint32_t row = map.out_w.quotient(first);
    uint32_t w = map.out_w.remainder(first, row);
    uint64_t source = static_cast<uint64_t>(map.source_row(row)) * map.in_w;
    Chunk chunk;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (!whole && first + k >= total) break;
      chunk.elements[k] = src[source + map.source_w(w)];
      if (++w == map.row_length && k + 1 < kChunk) {
        w = 0;
        source = static_cast<uint64_t>(map.source_row(++row)) * map.in_w;
      }
    }
    if (dst_aligned && whole) {
      *reinterpret_cast<uint4*>(dst + first) = chunk.vector;
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        if (first + k < total) dst[first + k] = chunk.elements[k];
    }
  }
}

inline unsigned blocks_for(int64_t threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(threads, int64_t{kThreads}), 1, kMaxBlocks));
}

// The widest unit (bytes, a power of two up to 16) that divides `bytes` and both
// pointers' addresses.
inline int unit_bytes(int64_t bytes, const void* src, const void* dst) {
  const auto alignment = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  int unit = 16;
  while (unit > 1 && (bytes % unit != 0 || alignment % unit != 0)) unit /= 2;
  return unit;
}

// f(std::integral_constant<int, bytes>) for bytes in 1, 2, 4, 8, 16; `op` names the
// caller in the error for any other size.
template <class F>
void with_bytes(int64_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    default:
      throw std::invalid_argument(std::string("cutlassfuse: ") + op +
                                  " copies elements of 1, 2, 4, 8 or 16 bytes, not " + std::to_string(bytes));
  }
}

// NDHWC: `pixels` output pixels of `pixel_bytes` each, in the widest units the pixel's
// bytes and the pointers allow (at least the elements' `element_bytes`).
template <class Map>
void launch_channels_last_gather(const void* src, void* dst, const Map& map, int64_t pixels, int64_t pixel_bytes,
                                 int64_t element_bytes, const char* op, cudaStream_t stream) {
  const int unit = unit_bytes(pixel_bytes, src, dst);
  if (unit < element_bytes)
    throw std::invalid_argument(std::string("cutlassfuse: ") + op + " takes pointers aligned to their elements");
  with_bytes(unit, op, [&](auto bytes) {
    using Unit = BitsOf<decltype(bytes)::value>;
    const auto units_per_pixel = static_cast<uint32_t>(pixel_bytes / sizeof(Unit));
    const int64_t total = pixels * units_per_pixel;
    if (total > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument(std::string("cutlassfuse: ") + op + " takes tensors of up to 2^31 - 1 elements");
    channels_last_gather_kernel<Map, Unit><<<blocks_for(ceil_div(total, int64_t{kUnits})), kThreads, 0, stream>>>(
        static_cast<const Unit*>(src), static_cast<Unit*>(dst), map, FastDivisor(units_per_pixel), units_per_pixel,
        static_cast<uint32_t>(total));
    check_launch("channels_last_gather_kernel");
  });
}

// NCDHW: `total` output elements of kBytes, gathered.
template <class Map, int kBytes>
void launch_channels_first_gather(const void* src, void* dst, const Map& map, int64_t total, cudaStream_t stream) {
  using Element = BitsOf<kBytes>;
  const bool dst_aligned = reinterpret_cast<uintptr_t>(dst) % sizeof(uint4) == 0;
  channels_first_gather_kernel<Map, Element>
      <<<blocks_for(ceil_div(total, int64_t{sizeof(uint4) / kBytes})), kThreads, 0, stream>>>(
          static_cast<const Element*>(src), static_cast<Element*>(dst), map, static_cast<uint32_t>(total), dst_aligned);
  check_launch("channels_first_gather_kernel");
}

}  // namespace cutlassfuse::gather_copy
