// 16-byte global accesses with an L2 eviction priority (sm_80's createpolicy and
// L2::cache_hint), for a kernel that reads part of a tensor twice and the rest once:
// what it reads again is loaded evict-last, everything it reads or writes for the last
// time evict-first, so that the lines it comes back for are the ones L2 still holds.
#pragma once

#include <cstdint>

namespace cutlassfuse {

// An L2 cache policy (createpolicy's 64-bit operand) for every access it is given to.
struct L2Policy {
  uint64_t bits;

  __device__ static L2Policy evict_first() {
    L2Policy p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p.bits));
    return p;
  }
  __device__ static L2Policy evict_normal() {
    L2Policy p;
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p.bits));
    return p;
  }
  __device__ static L2Policy evict_last() {
    L2Policy p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p.bits));
    return p;
  }
};

__device__ __forceinline__ uint4 load_with(const void* global, L2Policy policy) {
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(global), "l"(policy.bits));
  return v;
}

__device__ __forceinline__ void store_with(void* global, const uint4& v, L2Policy policy) {
  asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" ::"l"(global), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w), "l"(policy.bits)
               : "memory");
}

// 16 bytes from global to shared memory without registers (cp.async, through L2 only).
__device__ __forceinline__ void copy_async_with(void* shared, const void* global, L2Policy policy) {
  const auto address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(address), "l"(global),
               "l"(policy.bits)
               : "memory");
}

}  // namespace cutlassfuse
