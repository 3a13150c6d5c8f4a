// GroupNorm with its activations in one cooperative launch, the tensor held on chip
// between its read and its normalize. See cutlassfuse/norm/group_norm_resident.h.
//
// A block owns one contiguous chunk of a unit (NCDHW: a (sample, group) span of
// channels_per_group planes; NDHWC: a sample's rows of pixels, all channels), in
// kVector-element vectors: thread t takes vectors t, t + kThreads, ... Its shared memory
// holds the chunk's first `kept` vectors (staged); the rest, where the chunk is larger,
// streams: read in phase 1 with L2's evict-last priority and again in phase 3, from L2,
// while everything read or written for the last time is evict-first. Its statistics are
// sums of deviations from a shift (a value of the chunk, as norm_statistics.cu's),
// reduced in a fixed order into one partial per group it holds. NDHWC rows are a power
// of two of vectors up to 32, so a thread stays on one vector of channels and its lanes
// reduce by shuffles.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cutlassfuse/norm/group_norm_finalize.cuh"
#include "cutlassfuse/norm/group_norm_resident.h"
#include "norm/channel_vector.cuh"

namespace cutlassfuse {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Two blocks per SM, each with half its shared memory: the NDHWC kernel's sums and
// channel constants take 92 registers a thread (ptxas -v), too many for three.
constexpr int kBlocksPerSm = 2;
// What the GPU reserves of an SM's shared memory per resident block.
constexpr int kReservedSharedPerBlock = 1024;
// NDHWC: channels up to kMaxRowVectors vectors a row (a warp's lanes hold whole rows).
constexpr int kMaxRowVectors = 32;
// A thread's staged vectors are copied in kCopyGroups groups, each summed as soon as it
// lands, while the later ones are still in flight.
constexpr int kCopyGroups = 4;
// The streamed parts of all blocks together take at most this share of L2, which also
// sees the staged vectors pass and the output written.
constexpr double kStreamedL2Share = 0.75;
// Only 16-bit tensors stream: a float32 one, streamed, measured slower than the three
// launches (docs/performance.md).
template <class T>
constexpr bool kStreams = sizeof(T) == 2;

template <class T>
struct ResidentArgs {
  const T* y;
  T* out;
  const T* residual;
  PreTerms<T> pre;
  ActivationParams after;
  GroupNormAffine affine;
  float eps;
  int64_t spatial;
  int channels;
  int num_groups;
  int parts;
  int64_t part_length;        // NCDHW: vectors of a span a part holds; NDHWC: rows
  int kept;                   // vectors of a part staged in shared memory
  FastDivisor plane_vectors;  // NCDHW: spatial / kVector
  WelfordPartial* partials;   // [sample, group, part]
  float2* mean_rstd;          // [sample, group]
  float* mean;
  float* rstd;
};

// The block's shared memory: its reduction scratch, then the staged vectors. Sizes in
// elements: `sums` channels summed per thread (NDHWC: the row's; NCDHW: one), `normalized`
// channels whose scale and shift the block holds.
struct SharedLayout {
  int sums;
  int normalized;

  CUTLASSFUSE_HOST_DEVICE int scratch_bytes() const {
    const int bytes = kWarps * sums * 8 + normalized * 8 + sums * 4 + sums * 12;
    return (bytes + 15) / 16 * 16;
  }
};

struct Scratch {
  float2* warp_sums;        // [kWarps][sums]: each warp's (sum, squares)
  float2* scale_shift;      // [normalized]
  float* shift;             // [sums]
  WelfordPartial* channel;  // [sums], then merged per group

  __device__ Scratch(char* base, const SharedLayout& l)
      : warp_sums(reinterpret_cast<float2*>(base)), scale_shift(warp_sums + kWarps * l.sums),
        shift(reinterpret_cast<float*>(scale_shift + l.normalized)),
        channel(reinterpret_cast<WelfordPartial*>(shift + l.sums)) {}
};

// The block's chunk: `vectors` vectors from element `first` of y, the first `kept` of
// them staged in shared memory, the rest streamed.
struct Chunk {
  int64_t first;
  int vectors;
  int kept;

  // The thread's vectors: k = 0 .. own() - 1, the index(k)-th of the chunk; the first
  // staged() of them staged.
  __device__ int own() const { return below(vectors); }
  __device__ int staged() const { return below(kept); }
  __device__ bool streams() const { return kept < vectors; }
  __device__ int64_t offset(int k) const { return first + int64_t{index(k)} * kVector; }
  __device__ static int index(int k) { return static_cast<int>(threadIdx.x) + k * kThreads; }

 private:
  // The thread's vectors of the chunk's first `limit`.
  __device__ static int below(int limit) {
    const int t = static_cast<int>(threadIdx.x);
    return limit > t ? (limit - t + kThreads - 1) / kThreads : 0;
  }
};

// A vector from global to shared memory without registers (sm_80's cp.async).
template <class T>
__device__ __forceinline__ void copy_async(LoadedVector<T>& shared, const T* global, L2Policy policy) {
#pragma unroll
  for (int w = 0; w < static_cast<int>(std::size(shared.words)); ++w)
    copy_async_with(&shared.words[w], global + w * LoadedVector<T>::kWordElements, policy);
}

__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// The thread's own copies landed but the last `pending` groups (no other thread reads
// them: no barrier needed).
__device__ __forceinline__ void wait_copies_but(int pending) {
  static_assert(kCopyGroups == 4, "one case per group");
  switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
  }
}

// f(k, vector) for each of the thread's streamed vectors, read from `src` with `policy`,
// kUnroll loads in flight.
template <class T, class F>
__device__ __forceinline__ void for_streamed(const T* src, const Chunk& chunk, L2Policy policy, const F& f) {
  const int own = chunk.own();
  for (int k = chunk.staged(); k < own; k += kUnroll<T>) {
    LoadedVector<T> loaded[kUnroll<T>];
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u)
      if (k + u < own) loaded[u].load(src + chunk.offset(k + u), policy);
#pragma unroll
    for (int u = 0; u < kUnroll<T>; ++u)
      if (k + u < own) f(k + u, loaded[u]);
  }
}

// Phase 1 of a thread: the sums of pre(v) - shift over its vectors (v of the channel
// `slot(i)` of kSums sums at i), in the order of k, with `pre(k, v)` applying pre().
// The staged vectors are copied in kCopyGroups groups, all in flight at once, each
// summed as it lands; the streamed ones are read to stay in L2 for phase 3.
template <class T, int kSums, class Pre, class Slot>
__device__ __forceinline__ void sum_chunk(const T* y, const Chunk& chunk, LoadedVector<T>* stage, const Pre& pre,
                                          const Slot& slot, const float (&shift)[kSums], float (&sum)[kSums],
                                          float (&squares)[kSums]) {
  // By value: one 16-byte shared-memory load a vector, not one per element.
  const auto add = [&](int k, const LoadedVector<T> loaded) {
    float v[kVector];
    loaded.unpack(v);
    pre(k, v);
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      const int s = slot(i);
      const float x = v[i] - shift[s];
      sum[s] += x;
      squares[s] = fmaf(x, x, squares[s]);
    }
  };
  const int staged = chunk.staged();
  const L2Policy read_once = L2Policy::evict_first();
#pragma unroll
  for (int group = 0; group < kCopyGroups; ++group) {
    for (int k = staged * group / kCopyGroups; k < staged * (group + 1) / kCopyGroups; ++k)
      copy_async(stage[Chunk::index(k)], y + chunk.offset(k), read_once);
    commit_copies();
  }
  // Not unrolled: one copy of the loop body (and of pre()'s kinds) a kernel, not four.
#pragma unroll 1
  for (int group = 0; group < kCopyGroups; ++group) {
    wait_copies_but(kCopyGroups - 1 - group);
    for (int k = staged * group / kCopyGroups; k < staged * (group + 1) / kCopyGroups; ++k)
      add(k, stage[Chunk::index(k)]);
  }
  if (chunk.streams()) for_streamed(y, chunk, L2Policy::evict_last(), add);
}

// Phase 3 of a thread: out = normalize(k, v) (+ the residual) for each of its vectors:
// the streamed ones first, while L2 still holds them, then the staged ones. Where the
// chunk streams, its stores are evict-first, not to displace what is still to be read.
template <class T, class Normalize>
__device__ __forceinline__ void normalize_chunk(const ResidentArgs<T>& a, const Chunk& chunk,
                                                const LoadedVector<T>* stage, const Normalize& normalize) {
  const L2Policy store_policy = chunk.streams() ? L2Policy::evict_first() : L2Policy::evict_normal();
  const auto write = [&](int k, const LoadedVector<T> loaded) {
    float v[kVector];
    loaded.unpack(v);
    normalize(k, v);
    const int64_t offset = chunk.offset(k);
    add_residual(a.residual, offset, v);
    LoadedVector<T> packed;
    packed.pack(v);
    packed.store(a.out + offset, store_policy);
  };
  if (chunk.streams()) for_streamed(static_cast<const T*>(a.y), chunk, L2Policy::evict_first(), write);
  for (int k = 0; k < chunk.staged(); ++k) write(k, stage[Chunk::index(k)]);
}

// The merge of `parts` consecutive partials in a fixed order: lane l takes parts l,
// l + 32, ..., then a shuffle tree. Complete at lane 0. Read through L2: other blocks
// wrote them in this launch.
__device__ WelfordPartial merge_parts(const WelfordPartial* first, int parts) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  WelfordPartial acc{0.f, 0.f, 0.f};
  for (int p = lane; p < parts; p += 32) {
    const WelfordPartial* partial = first + p;
    acc = merge(acc, {__ldcg(&partial->count), __ldcg(&partial->mean), __ldcg(&partial->m2)});
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) acc = merge(acc, shuffle_down(acc, offset));
  return acc;
}

// Phase 2, between two grid barriers: each (sample, group) merged by one warp of the
// grid into its mean and rstd (as group_norm_finalize computes them). One warp a group,
// its partials contiguous: every block merging every group it holds instead had all
// blocks read the same few lines of L2 at once.
template <class T>
__device__ void finalize_groups(const ResidentArgs<T>& a, int64_t batch) {
  cg::grid_group grid = cg::this_grid();
  grid.sync();
  const int64_t warps = int64_t{gridDim.x} * kWarps;
  for (int64_t item = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32; item < batch * a.num_groups; item += warps) {
    const WelfordPartial total = merge_parts(a.partials + item * a.parts, a.parts);
    if (threadIdx.x % 32 == 0) {
      const float2 mean_rstd{total.mean, group_rstd(total, a.eps)};
      a.mean_rstd[item] = mean_rstd;
      if (a.mean != nullptr) {
        a.mean[item] = mean_rstd.x;
        a.rstd[item] = mean_rstd.y;
      }
    }
  }
  grid.sync();
}

// NCDHW: block (span n * groups + g, part). One sum a thread; the channel of vector k
// from its index in the span.
template <class T>
__device__ void resident_channels_first(const ResidentArgs<T>& a, char* shared) {
  const int channels_per_group = a.channels / a.num_groups;
  const SharedLayout layout{1, channels_per_group};
  const Scratch s(shared, layout);
  auto* stage = reinterpret_cast<LoadedVector<T>*>(shared + layout.scratch_bytes());
  const int64_t span = blockIdx.x / a.parts;
  const int part = static_cast<int>(blockIdx.x % a.parts);
  const int g = static_cast<int>(span % a.num_groups);
  const int64_t span_vectors = channels_per_group * a.spatial / kVector;
  const int64_t part_begin = std::min(span_vectors, part * a.part_length);
  const int vectors = static_cast<int>(std::min(span_vectors - part_begin, a.part_length));
  const Chunk chunk{(span * span_vectors + part_begin) * kVector, vectors, std::min(vectors, a.kept)};
  const int first_channel = g * channels_per_group;
  // The channel of the thread's k-th vector, within the group.
  const auto local_channel = [&](int k) {
    return static_cast<int>(a.plane_vectors.quotient(static_cast<uint32_t>(part_begin + Chunk::index(k))));
  };

  float shift[1] = {0.f};
  if (vectors > 0) {
    const int c = first_channel + static_cast<int>(a.plane_vectors.quotient(static_cast<uint32_t>(part_begin)));
    shift[0] = to_float(a.y[chunk.first]);
    apply_pre(a.pre, shift, [&](int) { return c; });
  }
  float sum[1] = {0.f};
  float squares[1] = {0.f};
  const auto one_sum = [](int) { return 0; };
  if (a.pre.is_identity()) {
    sum_chunk(a.y, chunk, stage, [](int, float (&)[kVector]) {}, one_sum, shift, sum, squares);
  } else {
    const auto pre = [&](int k, float (&v)[kVector]) {
      apply_pre_to_channel(a.pre, v, first_channel + local_channel(k));
    };
    sum_chunk(a.y, chunk, stage, pre, one_sum, shift, sum, squares);
  }
#pragma unroll
  for (int lanes = 16; lanes > 0; lanes /= 2) {
    sum[0] += __shfl_xor_sync(0xffffffffu, sum[0], lanes);
    squares[0] += __shfl_xor_sync(0xffffffffu, squares[0], lanes);
  }
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (threadIdx.x % 32 == 0) s.warp_sums[warp] = {sum[0], squares[0]};
  __syncthreads();
  if (threadIdx.x == 0) {
    float2 total{0.f, 0.f};
    for (int w = 0; w < kWarps; ++w) total = {total.x + s.warp_sums[w].x, total.y + s.warp_sums[w].y};
    a.partials[blockIdx.x] = vectors > 0
                                 ? shifted_moments(static_cast<float>(vectors * kVector), shift[0], total.x, total.y)
                                 : WelfordPartial{0.f, 0.f, 0.f};
  }

  finalize_groups(a, gridDim.x / a.parts / a.num_groups);
  const float2 mean_rstd = __ldcg(a.mean_rstd + span);
  for (int c = static_cast<int>(threadIdx.x); c < channels_per_group; c += kThreads)
    s.scale_shift[c] = channel_scale_shift(a.affine, first_channel + c, mean_rstd.x, mean_rstd.y);
  __syncthreads();

  normalize_chunk(a, chunk, stage, [&](int k, float (&v)[kVector]) {
    const int local = local_channel(k);
    const int c = first_channel + local;
    apply_pre_to_channel(a.pre, v, c);
    const float2 ss = s.scale_shift[local];
#pragma unroll
    for (int i = 0; i < kVector; ++i) v[i] = fmaf(v[i], ss.x, ss.y);
    activate_each(a.after, v, [&](int) { return c; });
  });
}

// NDHWC: block (sample n, part of its rows). kVector sums a thread, its channels'.
template <class T>
__device__ void resident_channels_last(const ResidentArgs<T>& a, char* shared) {
  const SharedLayout layout{a.channels, a.channels};
  const Scratch s(shared, layout);
  auto* stage = reinterpret_cast<LoadedVector<T>*>(shared + layout.scratch_bytes());
  const int64_t n = blockIdx.x / a.parts;
  const int part = static_cast<int>(blockIdx.x % a.parts);
  const int row_vectors = a.channels / kVector;
  const int64_t row_begin = std::min(a.spatial, part * a.part_length);
  const int rows = static_cast<int>(std::min(a.spatial - row_begin, a.part_length));
  const int vectors = rows * row_vectors;
  const Chunk chunk{(n * a.spatial + row_begin) * a.channels, vectors, std::min(vectors, a.kept)};
  const int column = static_cast<int>(threadIdx.x) % row_vectors * kVector;  // the thread's first channel
  const ChannelTerms<kVector> pre_channels(a.pre, [&](int i) { return column + i; }, kVector);
  const auto pre = [&](int, float (&v)[kVector]) { pre_channels.apply(v, [](int i) { return i; }); };

  float shift[kVector] = {};
  if (rows > 0) {
    LoadedVector<T> first;
    first.load(a.y + chunk.first + column);
    first.unpack(shift);
    pre(0, shift);
  }
  float sum[kVector] = {};
  float squares[kVector] = {};
  const auto own_sum = [](int i) { return i; };
  if (a.pre.is_identity()) {
    sum_chunk(a.y, chunk, stage, [](int, float (&)[kVector]) {}, own_sum, shift, sum, squares);
  } else {
    sum_chunk(a.y, chunk, stage, pre, own_sum, shift, sum, squares);
  }
  for (int lanes = row_vectors; lanes < 32; lanes *= 2) {
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      sum[i] += __shfl_xor_sync(0xffffffffu, sum[i], lanes);
      squares[i] += __shfl_xor_sync(0xffffffffu, squares[i], lanes);
    }
  }
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (static_cast<int>(threadIdx.x % 32) < row_vectors) {
#pragma unroll
    for (int i = 0; i < kVector; ++i) {
      s.warp_sums[warp * a.channels + column + i] = {sum[i], squares[i]};
      if (warp == 0) s.shift[column + i] = shift[i];
    }
  }
  __syncthreads();
  for (int c = static_cast<int>(threadIdx.x); c < a.channels; c += kThreads) {
    float2 total{0.f, 0.f};
    for (int w = 0; w < kWarps; ++w) {
      const float2 part_sums = s.warp_sums[w * a.channels + c];
      total = {total.x + part_sums.x, total.y + part_sums.y};
    }
    s.channel[c] = rows > 0 ? shifted_moments(static_cast<float>(rows), s.shift[c], total.x, total.y)
                            : WelfordPartial{0.f, 0.f, 0.f};
  }
  __syncthreads();
  // Each group's channels merged by Chan's formula in a fixed tree.
  const int channels_per_group = a.channels / a.num_groups;
  for (int step = 1; step < channels_per_group; step *= 2) {
    for (int c = static_cast<int>(threadIdx.x); c < a.channels; c += kThreads) {
      const int k = c % channels_per_group;
      if (k % (2 * step) == 0 && k + step < channels_per_group) s.channel[c] = merge(s.channel[c], s.channel[c + step]);
    }
    __syncthreads();
  }
  for (int g = static_cast<int>(threadIdx.x); g < a.num_groups; g += kThreads)
    a.partials[(n * a.num_groups + g) * a.parts + part] = s.channel[g * channels_per_group];

  finalize_groups(a, gridDim.x / a.parts);
  for (int c = static_cast<int>(threadIdx.x); c < a.channels; c += kThreads) {
    const float2 mean_rstd = __ldcg(a.mean_rstd + n * a.num_groups + c / channels_per_group);
    s.scale_shift[c] = channel_scale_shift(a.affine, c, mean_rstd.x, mean_rstd.y);
  }
  __syncthreads();

  const ChannelVector terms(a.pre, a.after, s.scale_shift, column);
  normalize_chunk(a, chunk, stage, [&](int, float (&v)[kVector]) {
    terms.apply_pre(a.pre.activation, v);
    terms.apply_norm_after(a.after, v);
  });
}

template <class T, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    norm_activation_resident_kernel(const __grid_constant__ ResidentArgs<T> a) {
  extern __shared__ __align__(16) char shared[];
  if constexpr (kChannelsLast) {
    resident_channels_last(a, shared);
  } else {
    resident_channels_first(a, shared);
  }
}

// What a GPU holds of one kernel: resident blocks, and the shared memory each gets.
struct ResidentCapacity {
  int blocks = 0;
  int shared_bytes = 0;
  int l2_bytes = 0;
};

template <class T, bool kChannelsLast>
auto resident_kernel() {
  return norm_activation_resident_kernel<T, kChannelsLast>;
}

// The current device's capacity for the kernel, queried once per device (the kernel's
// shared memory limit is raised then): driver queries per call would show in the host
// time of small calls.
template <class T, bool kChannelsLast>
ResidentCapacity device_capacity() {
  const auto kernel = resident_kernel<T, kChannelsLast>();
  constexpr int kMaxDevices = 64;
  static ResidentCapacity capacities[kMaxDevices];
  static std::atomic<bool> known[kMaxDevices];
  int device = 0;
  check_cuda(cudaGetDevice(&device), "querying the current device");
  if (device < kMaxDevices && known[device].load(std::memory_order_acquire)) return capacities[device];
  int sms = 0;
  int per_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "querying the SM count");
  check_cuda(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
             "querying shared memory");
  ResidentCapacity c;
  check_cuda(cudaDeviceGetAttribute(&c.l2_bytes, cudaDevAttrL2CacheSize, device), "querying the L2 size");
  c.shared_bytes = (per_sm / kBlocksPerSm - kReservedSharedPerBlock) / 16 * 16;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, c.shared_bytes),
             "raising the resident norm's shared memory");
  int per_sm_blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_blocks, kernel, kThreads, c.shared_bytes),
             "querying the resident norm's occupancy");
  c.blocks = per_sm_blocks * sms;
  if (device < kMaxDevices) {
    capacities[device] = c;
    known[device].store(true, std::memory_order_release);
  }
  return c;
}

// Whether the resident kernel takes the call's layout, channels and pointers.
bool takes(const ResidentNormCall& c) {
  const GroupNormShape& shape = c.shape;
  const int64_t elements = shape.batch * shape.channels * shape.spatial;
  if (!aligned(c.y) || !aligned(c.out) || !aligned(c.residual)) return false;
  if (elements == 0 || elements >= (int64_t{1} << 31)) return false;
  if (c.layout == ActivationLayout::kChannelsFirst) return shape.spatial % kVector == 0;
  const int64_t row_vectors = shape.channels / kVector;
  return shape.channels % kVector == 0 && row_vectors <= kMaxRowVectors && (row_vectors & (row_vectors - 1)) == 0 &&
         ChannelVector::holds(c.pre.activation, c.after);
}

SharedLayout shared_layout(const GroupNormShape& shape, ActivationLayout layout) {
  const auto channels = static_cast<int>(shape.channels);
  const auto groups = static_cast<int>(shape.num_groups);
  return layout == ActivationLayout::kChannelsLast ? SharedLayout{channels, channels}
                                                   : SharedLayout{1, channels / groups};
}

// Vectors a unit holds, and how many there are.
int64_t unit_vectors(const GroupNormShape& shape, ActivationLayout layout) {
  return layout == ActivationLayout::kChannelsLast ? shape.spatial * shape.channels / kVector
                                                   : shape.channels / shape.num_groups * shape.spatial / kVector;
}

int64_t units(const GroupNormShape& shape, ActivationLayout layout) {
  return layout == ActivationLayout::kChannelsLast ? shape.batch : shape.batch * shape.num_groups;
}

template <class T, bool kChannelsLast>
std::optional<ResidentNormPlan> plan_for(const ResidentNormCall& c) {
  const ResidentCapacity capacity = device_capacity<T, kChannelsLast>();
  const int64_t stage_vectors =
      (capacity.shared_bytes - shared_layout(c.shape, c.layout).scratch_bytes()) / int64_t{sizeof(LoadedVector<T>)};
  const int64_t count = units(c.shape, c.layout);
  if (count > capacity.blocks) return std::nullopt;
  // Parts a unit: as many as the GPU holds, none without a vector for every thread.
  const int64_t vectors = unit_vectors(c.shape, c.layout);
  const int64_t parts = std::min(capacity.blocks / count, std::max<int64_t>(1, vectors / kThreads));
  // NDHWC parts are whole rows.
  const int64_t row_vectors = kChannelsLast ? c.shape.channels / kVector : 1;
  const int64_t part_length = ceil_div(ceil_div(vectors, parts), row_vectors);
  // What shared memory does not hold streams, as much as L2 keeps between the phases.
  const int64_t part_vectors = part_length * row_vectors;
  const int64_t kept = std::min(part_vectors, stage_vectors);
  const int64_t streamed_bytes = (part_vectors - kept) * count * parts * int64_t{sizeof(LoadedVector<T>)};
  if (streamed_bytes > 0 && (!kStreams<T> || streamed_bytes > kStreamedL2Share * capacity.l2_bytes))
    return std::nullopt;
  return ResidentNormPlan{count, static_cast<int>(parts), part_length, kept, c.shape.batch * c.shape.num_groups};
}

template <class T, bool kChannelsLast>
bool launch(const ResidentNormCall& c, const ResidentNormPlan& plan, cudaStream_t stream) {
  const auto kernel = resident_kernel<T, kChannelsLast>();
  const ResidentCapacity capacity = device_capacity<T, kChannelsLast>();
  ResidentArgs<T> a{static_cast<const T*>(c.y),
                    static_cast<T*>(c.out),
                    static_cast<const T*>(c.residual),
                    pre_terms<T>(c.pre),
                    c.after,
                    c.affine,
                    c.eps,
                    c.shape.spatial,
                    static_cast<int>(c.shape.channels),
                    static_cast<int>(c.shape.num_groups),
                    plan.parts,
                    plan.part_length,
                    static_cast<int>(plan.kept),
                    FastDivisor(static_cast<uint32_t>(c.shape.spatial / kVector)),
                    static_cast<WelfordPartial*>(c.workspace),
                    reinterpret_cast<float2*>(static_cast<char*>(c.workspace) + plan.partials_bytes()),
                    c.mean,
                    c.rstd};
  void* args[] = {&a};
  const cudaError_t error = cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel),
                                                        dim3(static_cast<unsigned>(plan.units * plan.parts)),
                                                        dim3(kThreads), args, capacity.shared_bytes, stream);
  if (error == cudaErrorCooperativeLaunchTooLarge) {
    (void)cudaGetLastError();  // not sticky: clear it for the separate launches that follow
    return false;
  }
  check_cuda(error, "launching norm_activation_resident_kernel");
  return true;
}

// f(channels_last, element) with both as types: std::bool_constant and T{}.
template <class F>
auto with_kernel(const ResidentNormCall& c, F&& f) {
  decltype(f(std::true_type{}, float{})) result{};
  with_type(c.element, [&](auto t) {
    result = c.layout == ActivationLayout::kChannelsLast ? f(std::true_type{}, t) : f(std::false_type{}, t);
  });
  return result;
}

}  // namespace

std::optional<ResidentNormPlan> plan_resident_norm(const ResidentNormCall& call) {
  if (!takes(call)) return std::nullopt;
  return with_kernel(
      call, [&](auto channels_last, auto t) { return plan_for<decltype(t), decltype(channels_last)::value>(call); });
}

bool norm_activation_resident(const ResidentNormCall& call, const ResidentNormPlan& plan, cudaStream_t stream) {
  return with_kernel(call, [&](auto channels_last, auto t) {
    return launch<decltype(t), decltype(channels_last)::value>(call, plan, stream);
  });
}

}  // namespace cutlassfuse
