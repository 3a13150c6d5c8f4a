// How fast can R SMs normalize an NDHWC activation in place while the other SMs are
// busy? The streamed-finish design (docs/performance.md) reserves R
// SMs beside the deconvolution; it pays only if those SMs move kb61's 2 x 161 MB while
// the conv runs (~45 GB/s per SM at R = 16). Register-path blocks reached ~19-23 GB/s
// per SM; this probe measures a persistent block per SM that streams 32 KB chunks
// through a ring of shared-memory stages with cp.async.bulk (1D: a channels-last strip
// is contiguous), normalizes them in place and writes them back with bulk stores.
//
// Each run times the probe alone and beside a companion kernel on the other 132 - R
// SMs that reads an L2-resident buffer as fast as it can (the conv keeps L2 ~67 % busy),
// with the R free SMs spread over the chip or the highest-numbered ones (Placement).
//
// What it showed (H100): ~97 GB/s per SM at R = 8-16 in every
// placement, beside a companion reading 4-8 TB/s from L2 as alone. It bounds the memory
// side only: the streamed kernel built on it (local branch streamed-bulk) first ran at
// ~32 GB/s per SM, issue-bound by a per-vector channel index (not modelled here), and the
// conv beside it slowed by more than the SMs it gave up.
//
// Its few PTX wrappers (mbarrier, bulk copies) are its own rather than CuTe's so that it
// builds with nvcc alone, without the CUTLASS wheel's include path.
//
// Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o probe \
//          benchmarks/probes/streamed_normalize_probe.cu
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int kThreads = 256;
constexpr int kChannels = 128;
constexpr int kVectorsPerPixel = kChannels / 8;
static_assert(kThreads % kVectorsPerPixel == 0, "a thread keeps the same eight channels");

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(bar)));
}
__device__ __forceinline__ void expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes));
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT;\n}\n" ::"r"(smem_address(bar)),
      "r"(phase)
      : "memory");
}
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
}
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(smem_address(src)),
               "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wait_stores_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

__device__ __forceinline__ int sm_id() {
  int id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

template <int kStages, int kChunkBytes>
__global__ void __launch_bounds__(kThreads, 1)
    streamed_normalize(__half* data, int64_t chunks, const float* scale, const float* shift, int* sms_used) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* loaded = reinterpret_cast<uint64_t*>(smem + kStages * kChunkBytes);
  char* data_bytes = reinterpret_cast<char*>(data);
  const int64_t first = blockIdx.x, step = gridDim.x;
  const int count = static_cast<int>((chunks - first + step - 1) / step);
  if (threadIdx.x == 0) {
    sms_used[blockIdx.x] = sm_id();
    for (int s = 0; s < kStages; ++s) barrier_init(&loaded[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int s = 0; s < kStages && s < count; ++s) {
      expect_bytes(&loaded[s], kChunkBytes);
      bulk_load(smem + s * kChunkBytes, data_bytes + (first + s * step) * kChunkBytes, kChunkBytes, &loaded[s]);
    }
  }
  __syncthreads();
  const int c0 = (threadIdx.x % kVectorsPerPixel) * 8;
  float sc[8], sh[8];
  for (int k = 0; k < 8; ++k) sc[k] = scale[c0 + k], sh[k] = shift[c0 + k];
  for (int i = 0; i < count; ++i) {
    const int s = i % kStages;
    barrier_wait(&loaded[s], (i / kStages) & 1);
    uint4* tile = reinterpret_cast<uint4*>(smem + s * kChunkBytes);
    for (int v = threadIdx.x; v < kChunkBytes / 16; v += kThreads) {
      uint4 bits = tile[v];
      __half2* h = reinterpret_cast<__half2*>(&bits);
      for (int k = 0; k < 4; ++k) {
        const float2 f = __half22float2(h[k]);
        h[k] = __floats2half2_rn(fmaf(f.x, sc[2 * k], sh[2 * k]), fmaf(f.y, sc[2 * k + 1], sh[2 * k + 1]));
      }
      tile[v] = bits;
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (threadIdx.x == 0) {
      bulk_store(data_bytes + (first + i * step) * kChunkBytes, tile, kChunkBytes);
      // The previous chunk's store has read its stage: refill that stage.
      wait_stores_read<1>();
      const int refill = i - 1 + kStages;
      if (i >= 1 && refill < count) {
        const int r = refill % kStages;
        expect_bytes(&loaded[r], kChunkBytes);
        bulk_load(smem + r * kChunkBytes, data_bytes + (first + refill * step) * kChunkBytes, kChunkBytes, &loaded[r]);
      }
    }
  }
  if (threadIdx.x == 0) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Which SMs the companion leaves to the probe: none (the probe alone), R SMs spread over
// the chip (every (SMs / R)-th), or the R highest-numbered SMs, which sit in one or two
// GPCs, where a persistent kernel launched on all but R SMs leaves its free ones.
enum class Placement { kAlone, kSpread, kHighest };

__device__ bool left_free(Placement placement, int sm, int reserved, int total) {
  if (placement == Placement::kHighest) return sm >= total - reserved;
  const int stride = total / reserved;
  return sm % stride == 0 && sm / stride < reserved;
}

// One block per SM but those left free: keeps the SM's L2 traffic up until *stop is set,
// 16-byte loads over an L2-resident buffer, their bytes counted into *loaded.
__global__ void __launch_bounds__(512, 1)
    l2_companion(Placement placement, int reserved, const uint4* buffer, int64_t vectors, volatile int* stop,
                 uint4* sink, unsigned long long* loaded) {
  if (left_free(placement, sm_id(), reserved, static_cast<int>(gridDim.x))) return;
  unsigned long long bytes = 0;
  uint4 acc = {0, 0, 0, 0};
  int64_t v = blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const long long give_up = clock64() + 200'000'000;  // ~0.1 s: never outlive a lost flag
  while (!*stop && clock64() < give_up) {
    for (int k = 0; k < 64; ++k) {
      const uint4 x = __ldcg(&buffer[v]);
      acc.x ^= x.x, acc.y ^= x.y, acc.z ^= x.z, acc.w ^= x.w;
      v += stride;
      if (v >= vectors) v -= vectors;
    }
    bytes += 64 * sizeof(uint4);
  }
  atomicAdd(loaded, bytes);
  if (acc.x == 0x12345678u) sink[0] = acc;
}

__global__ void set_flag(int* flag) { *flag = 1; }

template <int kStages, int kChunkBytes>
void run(int sms, __half* data, int64_t bytes, const float* scale, const float* shift, Placement placement,
         const uint4* l2_buffer, int64_t l2_vectors, int* stop, uint4* sink, unsigned long long* loaded, int* sms_used,
         int total_sms) {
  const bool companion = placement != Placement::kAlone;
  constexpr int smem = kStages * kChunkBytes + kStages * 8;
  CHECK(cudaFuncSetAttribute(streamed_normalize<kStages, kChunkBytes>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             smem));
  CHECK(cudaFuncSetAttribute(l2_companion, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  cudaStream_t probe_stream, companion_stream;
  CHECK(cudaStreamCreateWithFlags(&probe_stream, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&companion_stream, cudaStreamNonBlocking));
  cudaEvent_t start, end, companion_start, companion_end;
  for (cudaEvent_t* event : {&start, &end, &companion_start, &companion_end}) CHECK(cudaEventCreate(event));
  std::vector<float> times;
  double companion_bytes = 0, companion_ms = 0;
  const int64_t chunks = bytes / kChunkBytes;
  for (int rep = 0; rep < 7; ++rep) {
    if (companion) {
      CHECK(cudaMemset(stop, 0, sizeof(int)));
      CHECK(cudaMemset(loaded, 0, sizeof(*loaded)));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaEventRecord(companion_start, companion_stream));
      // 200 KB of shared memory each: one companion block per SM, so the probe gets the free ones.
      l2_companion<<<total_sms, 512, 200 * 1024, companion_stream>>>(placement, sms, l2_buffer, l2_vectors, stop, sink,
                                                                     loaded);
      CHECK(cudaEventRecord(companion_end, companion_stream));
    }
    CHECK(cudaEventRecord(start, probe_stream));
    streamed_normalize<kStages, kChunkBytes>
        <<<sms, kThreads, smem, probe_stream>>>(data, chunks, scale, shift, sms_used);
    CHECK(cudaEventRecord(end, probe_stream));
    if (companion) set_flag<<<1, 1, 0, probe_stream>>>(stop);
    CHECK(cudaDeviceSynchronize());
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, end));
    times.push_back(ms);
    if (companion) {
      unsigned long long bytes_loaded = 0;
      float companion_round_ms = 0;
      CHECK(cudaMemcpy(&bytes_loaded, loaded, sizeof(bytes_loaded), cudaMemcpyDeviceToHost));
      CHECK(cudaEventElapsedTime(&companion_round_ms, companion_start, companion_end));
      companion_bytes += static_cast<double>(bytes_loaded);
      companion_ms += companion_round_ms;
    }
  }
  std::vector<float> sorted = times;
  std::sort(sorted.begin(), sorted.end());
  const float ms = sorted[sorted.size() / 2];
  const double per_sm = 2.0 * bytes / (ms * 1e-3) / sms / 1e9;
  const char* names[] = {"alone", "beside, free SMs spread", "beside, highest SMs free"};
  std::printf("%-26s stages %d x %2d KB  R=%3d  %8.1f us  %6.1f GB/s per SM  %7.1f GB/s total",
              names[static_cast<int>(placement)], kStages, kChunkBytes / 1024, sms, ms * 1e3, per_sm, per_sm * sms);
  if (companion) std::printf("  (companion: %.0f GB/s of L2 reads)", companion_bytes / (companion_ms * 1e-3) / 1e9);
  std::vector<int> used(sms);
  CHECK(cudaMemcpy(used.data(), sms_used, sms * sizeof(int), cudaMemcpyDeviceToHost));
  std::sort(used.begin(), used.end());
  std::printf("  on SMs %d..%d\n", used.front(), used.back());
  for (cudaEvent_t event : {start, end, companion_start, companion_end}) CHECK(cudaEventDestroy(event));
  CHECK(cudaStreamDestroy(probe_stream));
  CHECK(cudaStreamDestroy(companion_stream));
}

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const int64_t bytes = int64_t{16} * 39304 * kChannels * 2 / (32 * 1024) * (32 * 1024);  // kb61's activation
  __half* data;
  float *scale, *shift;
  CHECK(cudaMalloc(&data, bytes));
  CHECK(cudaMemset(data, 0x3c, bytes));
  std::vector<float> ones(kChannels, 1.0f), zeros(kChannels, 0.0f);
  CHECK(cudaMalloc(&scale, kChannels * 4));
  CHECK(cudaMalloc(&shift, kChannels * 4));
  CHECK(cudaMemcpy(scale, ones.data(), kChannels * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(shift, zeros.data(), kChannels * 4, cudaMemcpyHostToDevice));
  const int64_t l2_bytes = int64_t{24} << 20;
  uint4* l2_buffer;
  uint4* sink;
  int* stop;
  unsigned long long* loaded;
  CHECK(cudaMalloc(&l2_buffer, l2_bytes));
  CHECK(cudaMemset(l2_buffer, 1, l2_bytes));
  CHECK(cudaMalloc(&sink, 16));
  CHECK(cudaMalloc(&stop, 4));
  CHECK(cudaMalloc(&loaded, sizeof(*loaded)));
  int* sms_used;
  CHECK(cudaMalloc(&sms_used, prop.multiProcessorCount * sizeof(int)));
  const int total = prop.multiProcessorCount;
  for (Placement placement : {Placement::kAlone, Placement::kSpread, Placement::kHighest}) {
    for (int sms : {8, 12, 16, 24, 132}) {
      if (placement != Placement::kAlone && sms == total) continue;
      run<6, 32 * 1024>(sms, data, bytes, scale, shift, placement, l2_buffer, l2_bytes / 16, stop, sink, loaded,
                        sms_used, total);
    }
  }
  return 0;
}
