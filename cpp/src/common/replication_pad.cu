// Replicate padding of packed 5-D tensors. See cutlassfuse/common/replication_pad.h.
#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "common/gather_copy.cuh"
#include "cutlassfuse/common/device_utils.cuh"
#include "cutlassfuse/common/replication_pad.h"

namespace cutlassfuse {
namespace {

using gather_copy::BitsOf;
using gather_copy::kMaxBlocks;
using gather_copy::kThreads;

constexpr const char* kOp = "replication_pad3d";

__device__ __forceinline__ uint32_t clamped(int64_t index, uint32_t extent) {
  return static_cast<uint32_t>(index < 0 ? 0 : index >= extent ? extent - 1 : index);
}

// The pad as a gather_copy Map: the input row or column that an output row or column
// copies, each index clamped into the input. 32-bit: replication_pad3d_takes bounds both
// tensors' elements.
struct PadGrid : gather_copy::Extents {
  int32_t front, top, left;

  explicit PadGrid(const ReplicationPad3d& p)
      : Extents(p.input, {p.output(0), p.output(1), p.output(2)}), front(static_cast<int32_t>(p.before[0])),
        top(static_cast<int32_t>(p.before[1])), left(static_cast<int32_t>(p.before[2])) {}

  // The input row of output row `row`, rows indexed (plane, d, h) with plane n * C + c
  // (NCDHW) or n (NDHWC).
  __device__ __forceinline__ uint32_t source_row(uint32_t row) const {
    const auto [plane, d, h] = row_coordinates(row);
    return (plane * in_d + clamped(int64_t{d} - front, in_d)) * in_h + clamped(int64_t{h} - top, in_h);
  }

  __device__ __forceinline__ uint32_t source_w(uint32_t w) const { return clamped(int64_t{w} - left, in_w); }
};

// NCDHW, rows up to kMaxRowBufferBytes: a block assembles whole output rows in shared
// memory at their 16-byte phase in the output, then copies that span out in aligned
// 16-byte chunks. The source rows arrive in coalesced Units (the widest that an input
// row's bytes and the pointer allow), stored into the buffer shifted by their pads in
// the widest pieces the shift allows; the pad elements copy their row's first or last.
// Elements gathered one by one from global memory instead issue a load per element, and
// the load pipeline, not memory, bounds the copy (about half a copy's speed).
constexpr int64_t kRowBufferBytes = 16 * 1024;
constexpr int64_t kMaxRowBufferBytes = 48 * 1024;  // the dynamic shared memory a launch gets without opting in
constexpr int kMaxRowsPerBlock = 128;

// `value` stored at `to` in pieces of kPieceBytes (`to` aligned to them).
template <int kPieceBytes, class Unit>
__device__ __forceinline__ void store_pieces(char* to, const Unit& value) {
  using Piece = BitsOf<kPieceBytes>;
  constexpr int kPieces = sizeof(Unit) / kPieceBytes;
  union {
    Unit unit;
    Piece pieces[kPieces];
  } split{value};
#pragma unroll
  for (int i = 0; i < kPieces; ++i) reinterpret_cast<Piece*>(to)[i] = split.pieces[i];
}

// `value` stored at byte `offset` of `buffer` (16-byte aligned) in the widest pieces the
// offset's alignment allows.
template <class Unit>
__device__ __forceinline__ void store_shifted(char* buffer, uint32_t offset, const Unit& value) {
  char* to = buffer + offset;
  if constexpr (sizeof(Unit) >= 16)
    if (offset % 16 == 0) return store_pieces<16>(to, value);
  if constexpr (sizeof(Unit) >= 8)
    if (offset % 8 == 0) return store_pieces<8>(to, value);
  if constexpr (sizeof(Unit) >= 4)
    if (offset % 4 == 0) return store_pieces<4>(to, value);
  if constexpr (sizeof(Unit) >= 2)
    if (offset % 2 == 0) return store_pieces<2>(to, value);
  store_pieces<1>(to, value);
}

// Per block and iteration, output rows [row0, row0 + rows): the buffer's element 0 is
// the output's element `base` (`begin`, the first row's start, rounded down to a chunk).
template <class Element, class Unit>
__global__ void __launch_bounds__(kThreads)
replication_pad_ncdhw_rows_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const PadGrid grid,
                                  uint32_t total_rows, uint32_t rows_per_block, const FastDivisor row_units,
                                  const FastDivisor row_pads, bool dst_aligned) {
  constexpr int kChunk = sizeof(uint4) / sizeof(Element);
  extern __shared__ uint4 buffer[];
  __shared__ uint32_t source_rows[kMaxRowsPerBlock];
  char* const bytes = reinterpret_cast<char*>(buffer);
  Element* const elements = reinterpret_cast<Element*>(buffer);
  const auto* src_units = reinterpret_cast<const Unit*>(src);
  const uint32_t units_per_row = grid.in_w * sizeof(Element) / sizeof(Unit);
  const uint32_t pads_per_row = grid.row_length - grid.in_w;
  for (uint32_t row0 = blockIdx.x * rows_per_block; row0 < total_rows; row0 += gridDim.x * rows_per_block) {
    const uint32_t rows = min(rows_per_block, total_rows - row0);
    const uint32_t begin = row0 * grid.row_length;
    const uint32_t end = begin + rows * grid.row_length;
    const uint32_t base = begin / kChunk * kChunk;
    if (threadIdx.x < rows) source_rows[threadIdx.x] = grid.source_row(row0 + threadIdx.x);
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < rows * units_per_row; i += kThreads) {
      const uint32_t r = row_units.quotient(i);
      const uint32_t unit = row_units.remainder(i, r);
      const Unit value = src_units[static_cast<uint64_t>(source_rows[r]) * units_per_row + unit];
      const uint32_t first = begin - base + r * grid.row_length + grid.left;
      store_shifted(bytes, first * static_cast<uint32_t>(sizeof(Element)) + unit * static_cast<uint32_t>(sizeof(Unit)),
                    value);
    }
    for (uint32_t i = threadIdx.x; i < rows * pads_per_row; i += kThreads) {
      const uint32_t r = row_pads.quotient(i);
      const uint32_t pad = row_pads.remainder(i, r);
      const bool left = pad < grid.left;
      const uint64_t source = static_cast<uint64_t>(source_rows[r]) * grid.in_w + (left ? 0 : grid.in_w - 1);
      elements[begin - base + r * grid.row_length + (left ? pad : pad + grid.in_w)] = src[source];
    }
    __syncthreads();
    for (uint32_t c = threadIdx.x; base + c * kChunk < end; c += kThreads) {
      const uint32_t first = base + c * kChunk;
      if (dst_aligned && first >= begin && first + kChunk <= end) {
        *reinterpret_cast<uint4*>(dst + first) = buffer[c];
      } else {
#pragma unroll
        for (int k = 0; k < kChunk; ++k)
          if (first + k >= begin && first + k < end) dst[first + k] = elements[c * kChunk + k];
      }
    }
    __syncthreads();
  }
}

template <int kBytes, int kUnitBytes>
void launch_ncdhw_rows(const void* src, void* dst, const ReplicationPad3d& p, int64_t rows_per_block,
                       int64_t buffer_bytes, bool dst_aligned, cudaStream_t stream) {
  using Element = BitsOf<kBytes>;
  const int64_t rows = p.output_elements() / p.output(2);
  const auto blocks = static_cast<unsigned>(std::min(ceil_div(rows, rows_per_block), kMaxBlocks));
  replication_pad_ncdhw_rows_kernel<Element, BitsOf<kUnitBytes>><<<blocks, kThreads, buffer_bytes, stream>>>(
      static_cast<const Element*>(src), static_cast<Element*>(dst), PadGrid(p), static_cast<uint32_t>(rows),
      static_cast<uint32_t>(rows_per_block), FastDivisor(static_cast<uint32_t>(p.input[2] * kBytes / kUnitBytes)),
      FastDivisor(static_cast<uint32_t>(std::max<int64_t>(p.output(2) - p.input[2], 1))), dst_aligned);
  check_launch("replication_pad_ncdhw_rows_kernel");
}

// Rows that fit the shared-memory buffer are assembled there (as many as kRowBufferBytes
// holds, up to kMaxRowsPerBlock); longer ones are gathered.
template <int kBytes>
void launch_ncdhw(const void* src, void* dst, const ReplicationPad3d& p, cudaStream_t stream) {
  const bool dst_aligned = reinterpret_cast<uintptr_t>(dst) % sizeof(uint4) == 0;
  const int64_t row_bytes = p.output(2) * kBytes;
  // The span of whole rows, plus a chunk on either side for its 16-byte phase.
  const auto buffer_for = [&](int64_t rows) { return ceil_div(rows * row_bytes, int64_t{16}) * 16 + 32; };
  if (buffer_for(1) > kMaxRowBufferBytes)
    return gather_copy::launch_channels_first_gather<PadGrid, kBytes>(src, dst, PadGrid(p), p.output_elements(),
                                                                      stream);
  const int64_t rows_per_block = std::clamp<int64_t>(kRowBufferBytes / row_bytes, 1, kMaxRowsPerBlock);
  gather_copy::with_bytes(gather_copy::unit_bytes(p.input[2] * kBytes, src, src), kOp, [&](auto unit) {
    constexpr int kUnitBytes = decltype(unit)::value;
    // Units are at least elements wide where the pointers are aligned to their elements.
    if constexpr (kUnitBytes >= kBytes)
      launch_ncdhw_rows<kBytes, kUnitBytes>(src, dst, p, rows_per_block, buffer_for(rows_per_block), dst_aligned,
                                            stream);
    else
      throw std::invalid_argument("cutlassfuse: replication_pad3d takes pointers aligned to their elements");
  });
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
    gather_copy::launch_channels_last_gather(src, dst, PadGrid(p), p.output_elements() / p.channels,
                                             p.channels * element_bytes, element_bytes, kOp, stream);
  } else {
    gather_copy::with_bytes(element_bytes, kOp,
                            [&](auto bytes) { launch_ncdhw<decltype(bytes)::value>(src, dst, p, stream); });
  }
}

}  // namespace cutlassfuse
