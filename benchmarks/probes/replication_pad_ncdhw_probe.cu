// Which NCDHW replicate-pad kernel reaches a copy's speed? The library's two kernels
// (cpp/src/common/replication_pad.cu, included here: whole rows assembled in shared
// memory, and gather_copy.cuh's 16-byte chunks gathered element by element from global
// memory) against three variants of the gather:
//   multi   four chunks a thread, all their loads in flight before the stores;
//   words   one 4-byte output word a lane, consecutive lanes on consecutive words;
//   staged  each block's source rows staged in shared memory with 16-byte loads, the
//           output chunks then gathered element by element from there.
// Each output is compared bit for bit with the library's gather kernel, and each kernel
// timed (median of 25 launches between CUDA events) beside a device-to-device copy of the
// output's size.
//
// What it showed (H200, fp16, pads (1, 1, 1, 1, 2, 0)), us for 1x128x17x256x256 /
// 1x256x17x128x128 / 1x512x9x64x64: gather 319 / 171 / 59, multi 350 / 186 / 63, words
// 352 / 185 / 62, staged 624 / 320 / 89, rows 170 / 87 / 31, copy 164 / 88 / 32. The
// gathers are bound by the load pipeline (an instruction per element, each warp's
// spanning 512 bytes) and their index arithmetic, not by memory or latency: more loads in
// flight or narrower lanes only add instructions. The rows kernel issues one load per 16
// bytes and moves the shift into shared memory.
//
// Build: nvcc -O3 -std=c++20 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//          -I cpp/include -I cpp/src -o probe benchmarks/probes/replication_pad_ncdhw_probe.cu
#include <algorithm>
#include <array>
#include <cstdio>
#include <functional>
#include <vector>

#include "../../cpp/src/common/replication_pad.cu"

namespace cutlassfuse {
namespace {

template <class Element>
__device__ __forceinline__ Element gathered(const Element* src, const PadGrid& grid, uint32_t row, uint32_t w) {
  return src[static_cast<uint64_t>(grid.source_row(row)) * grid.in_w + grid.source_w(w)];
}

// kChunks 16-byte chunks a thread, kThreads apart.
template <class Element, int kChunks>
__global__ void __launch_bounds__(kThreads)
    multi_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const PadGrid grid, uint32_t total) {
  constexpr int kChunk = sizeof(uint4) / sizeof(Element);
  union Chunk {
    uint4 vector;
    Element elements[kChunk];
  };
  const uint32_t chunks = total / kChunk;  // the probe's shapes fill whole chunks
  for (uint32_t base = blockIdx.x * kThreads * kChunks + threadIdx.x; base < chunks;
       base += gridDim.x * kThreads * kChunks) {
    Chunk chunk[kChunks];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const uint32_t first = (base + u * kThreads) * kChunk;
      if (first >= total) break;
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const uint32_t i = first + k;
        const uint32_t row = grid.out_w.quotient(i);
        chunk[u].elements[k] = gathered(src, grid, row, grid.out_w.remainder(i, row));
      }
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const uint32_t c = base + u * kThreads;
      if (c < chunks) reinterpret_cast<uint4*>(dst)[c] = chunk[u].vector;
    }
  }
}

// One 4-byte word a lane.
template <class Element>
__global__ void __launch_bounds__(kThreads)
    words_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const PadGrid grid, uint32_t total) {
  constexpr int kPerWord = sizeof(uint32_t) / sizeof(Element);
  union Word {
    uint32_t word;
    Element elements[kPerWord];
  };
  for (uint32_t c = blockIdx.x * kThreads + threadIdx.x; c < total / kPerWord; c += gridDim.x * kThreads) {
    Word word;
#pragma unroll
    for (int k = 0; k < kPerWord; ++k) {
      const uint32_t i = c * kPerWord + k;
      const uint32_t row = grid.out_w.quotient(i);
      word.elements[k] = gathered(src, grid, row, grid.out_w.remainder(i, row));
    }
    reinterpret_cast<uint32_t*>(dst)[c] = word.word;
  }
}

// A block's `rows` output rows: their source rows staged with 16-byte loads (rows of a
// multiple of 16 bytes), then the output chunks gathered from shared memory.
template <class Element>
__global__ void __launch_bounds__(kThreads)
    staged_kernel(const Element* __restrict__ src, Element* __restrict__ dst, const PadGrid grid, uint32_t total_rows,
                  uint32_t rows) {
  constexpr int kChunk = sizeof(uint4) / sizeof(Element);
  extern __shared__ uint4 staged[];
  const uint32_t vectors_per_row = grid.in_w / kChunk;
  const auto* src_vectors = reinterpret_cast<const uint4*>(src);
  const auto* elements = reinterpret_cast<const Element*>(staged);
  for (uint32_t row0 = blockIdx.x * rows; row0 < total_rows; row0 += gridDim.x * rows) {
    const uint32_t count = min(rows, total_rows - row0);
    for (uint32_t i = threadIdx.x; i < count * vectors_per_row; i += kThreads) {
      const uint32_t r = i / vectors_per_row;
      staged[i] = src_vectors[static_cast<uint64_t>(grid.source_row(row0 + r)) * vectors_per_row + i % vectors_per_row];
    }
    __syncthreads();
    const uint32_t begin = row0 * grid.row_length, end = begin + count * grid.row_length;
    for (uint32_t c = begin / kChunk + threadIdx.x; c * kChunk < end; c += kThreads) {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const uint32_t i = c * kChunk + k;
        if (i < begin || i >= end) continue;
        const uint32_t row = grid.out_w.quotient(i);
        dst[i] = elements[(row - row0) * grid.in_w + grid.source_w(grid.out_w.remainder(i, row))];
      }
    }
    __syncthreads();
  }
}

template <class F>
float median_ms(F launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < 28; ++i) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 3) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void run(const ReplicationPad3d& p) {
  using Element = uint16_t;
  const int64_t in_bytes = p.input_elements() * 2, out_bytes = p.output_elements() * 2;
  void *src, *expected, *out;
  cudaMalloc(&src, in_bytes);
  cudaMalloc(&expected, out_bytes);
  cudaMalloc(&out, out_bytes);
  std::vector<uint8_t> host(in_bytes);
  for (int64_t i = 0; i < in_bytes; ++i) host[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  cudaMemcpy(src, host.data(), in_bytes, cudaMemcpyHostToDevice);
  gather_copy::launch_channels_first_gather<PadGrid, 2>(src, expected, PadGrid(p), p.output_elements(), nullptr);
  const PadGrid grid(p);
  const auto total = static_cast<uint32_t>(p.output_elements());
  const auto rows = static_cast<uint32_t>(p.output_elements() / p.output(2));
  const uint32_t staged_rows = 16;
  const std::array<std::pair<const char*, std::function<void()>>, 6> kernels{{
      {"gather", [&] { gather_copy::launch_channels_first_gather<PadGrid, 2>(src, out, grid, total, nullptr); }},
      {"multi", [&] { multi_kernel<Element, 4><<<gather_copy::blocks_for(total / 32), kThreads>>>(
                          static_cast<const Element*>(src), static_cast<Element*>(out), grid, total); }},
      {"words", [&] { words_kernel<Element><<<gather_copy::blocks_for(total / 2), kThreads>>>(
                          static_cast<const Element*>(src), static_cast<Element*>(out), grid, total); }},
      {"staged", [&] { staged_kernel<Element><<<gather_copy::blocks_for(rows / staged_rows * kThreads), kThreads,
                                                staged_rows * p.input[2] * 2>>>(
                           static_cast<const Element*>(src), static_cast<Element*>(out), grid, rows, staged_rows); }},
      {"rows", [&] { launch_ncdhw<2>(src, out, p, nullptr); }},
      {"copy", [&] { cudaMemcpyAsync(out, expected, out_bytes, cudaMemcpyDeviceToDevice); }},
  }};
  std::printf("%ldx%ldx%ldx%ldx%ld fp16:", p.batch, p.channels, p.input[0], p.input[1], p.input[2]);
  std::vector<uint8_t> want(out_bytes), got(out_bytes);
  cudaMemcpy(want.data(), expected, out_bytes, cudaMemcpyDeviceToHost);
  for (const auto& [name, launch] : kernels) {
    cudaMemset(out, 0xff, out_bytes);
    launch();
    cudaMemcpy(got.data(), out, out_bytes, cudaMemcpyDeviceToHost);
    std::printf("  %s %.1f us%s", name, median_ms(launch) * 1e3, got == want ? "" : " (DIFFERS)");
  }
  std::printf("\n");
  cudaFree(src);
  cudaFree(expected);
  cudaFree(out);
}

}  // namespace
}  // namespace cutlassfuse

int main() {
  using cutlassfuse::ReplicationPad3d;
  // HunyuanVideo's causal pad: W and H by one on each side, two frames in front.
  for (const auto& [c, d, hw] : std::vector<std::array<int64_t, 3>>{{128, 17, 256}, {256, 17, 128}, {512, 9, 64}})
    cutlassfuse::run(ReplicationPad3d{1, c, {d, hw, hw}, {2, 1, 1}, {0, 1, 1}});
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) std::printf("CUDA error: %s\n", cudaGetErrorString(error));
  return error != cudaSuccess;
}
