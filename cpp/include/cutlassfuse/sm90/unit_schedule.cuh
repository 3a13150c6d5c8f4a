// Which units (PhaseTiles) each CTA of a ping-pong launch computes, and how its
// producer warp hands them to the two consumer warpgroups.
//
// Why a CTA draws units at run time: a unit's K blocks are those of the depth taps that
// reach its pixels (tap_window.h), so units differ in work by up to 3x, and a static
// walk (CTA c takes units c, c + G, c + 2G, ..., G the CTAs of the grid) hands some CTAs
// more blocks than others, and the launch ends with its busiest CTA; drawing the next
// unit when the producer needs it evens the CTAs out. Clusters keep the static walk:
// their CTAs must take the same units in step.
//
// The counter (UnitCounter, dgrad.h) lives in the call's workspace, memory nobody
// zeroed. CTA 0 initializes it as it starts: the draw count to zero, then the launch's
// epoch, a 64-bit value the host draws per launch. A CTA takes its first two units
// statically (one per consumer) and draws only once it has read the epoch, so no launch
// needs a memset before it. The CTA drawing the launch's last ticket clears the epoch:
// a CUDA graph replays a launch with the same counter and epoch, and the next replay must
// find the counter uninitialized again.
#pragma once

#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>

#include <atomic>
#include <cstdint>
#include <random>

#include "cutlassfuse/sm90/dgrad.h"

namespace cutlassfuse::sm90 {

// A launch's source of units: a counter, or nullptr for the static walk.
struct UnitSchedule {
  UnitCounter* counter = nullptr;
  uint64_t epoch = 0;
};

// A fresh nonzero epoch per launch: a process-wide sequence, mixed (splitmix64) with a
// seed drawn once, so that stale counters in reused workspace memory, which hold earlier
// epochs or zero, never match by accident.
inline uint64_t next_launch_epoch() {
  static const uint64_t seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  static std::atomic<uint64_t> launches{0};
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (launches.fetch_add(1, std::memory_order_relaxed) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z != 0 ? z : 1;
}

// `counter` with a fresh epoch, or the static walk: without a counter (the drawn
// schedule turned off), for clusters, for launches of at most two units per CTA (the
// ones every CTA takes statically anyway), and where units are even (no tile skips
// border taps): units of equal K blocks balance on the static walk, while a draw costs
// an atomic's round trip per unit, which units of a few K blocks may not hide.
inline UnitSchedule unit_schedule(UnitCounter* counter, bool uneven_units, int cluster_size, int units,
                                  int grid_units) {
  if (counter == nullptr || !uneven_units || cluster_size > 1 || units <= 2 * grid_units) return {};
  return {counter, next_launch_epoch()};
}

// Draws a launch's units for the producer warp (lane 0 draws, every lane gets the
// unit): after unit `unit`, the CTA's next unit, or `total` past the last. A draw's
// round trip (about a microsecond) stalls the producer only: the mainloop's stages it
// filled ahead keep the tensor cores busy meanwhile, and drawing no earlier than needed
// is what lets a CTA that finished early take the unit instead. Its state is one flag,
// the rest read from the kernel's parameters: registers are what the producer warp has
// least of (kProducerRegisters).
class UnitDrawer {
 public:
  // CTA 0 initializes the counter (see above).
  CUTLASS_DEVICE explicit UnitDrawer(UnitSchedule const& schedule) {
    if (schedule.counter != nullptr && blockIdx.x == 0 && cutlass::canonical_lane_idx() == 0) {
      schedule.counter->drawn = 0;
      // The draw count's reset, then the epoch that lets the other CTAs draw.
      asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(&schedule.counter->epoch), "l"(schedule.epoch)
                   : "memory");
    }
  }

  // `stride`: the units of a round of the static walk (the grid's clusters), whose first
  // round the CTAs take statically.
  CUTLASS_DEVICE int next(UnitSchedule const& schedule, int unit, int stride, int total) {
    if (schedule.counter == nullptr || unit < stride) return min(unit + stride, total);
    int drawn = 0;
    if (cutlass::canonical_lane_idx() == 0) drawn = draw(schedule, stride, total);
    return __shfl_sync(0xffffffffu, drawn, 0);
  }

 private:
  // Units 2G on are drawn: ticket t is unit 2G + t. Each CTA that draws at all draws
  // exactly one ticket past the units, so the launch draws units - 2G + drawing CTAs
  // tickets, and the one who draws the last clears the epoch.
  CUTLASS_DEVICE int draw(UnitSchedule const& schedule, int stride, int total) {
    UnitCounter* counter = schedule.counter;
    while (!epoch_seen_) {
      uint64_t epoch;
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(epoch) : "l"(&counter->epoch) : "memory");
      epoch_seen_ = epoch == schedule.epoch;
      if (!epoch_seen_) __nanosleep(64);
    }
    const int ticket = atomicAdd(&counter->drawn, 1);
    const int drawing_ctas = min(max(total - stride, 0), stride);
    if (ticket == max(total - 2 * stride, 0) + drawing_ctas - 1) {
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(&counter->epoch), "l"(uint64_t{0}) : "memory");
    }
    return min(2 * stride + ticket, total);
  }

  bool epoch_seen_ = false;
};

// The units a CTA's producer hands its consumers, in order. Both consumers read every
// unit: their own, and the other's, whose pipeline stages they skip. After the last
// unit the producer pushes `total` twice: the consumer of the unit after the last reads
// one as its own, the other reads the first to skip and the second as its own. A ring
// of mbarriers whose only state per role is the count of units pushed or popped (one
// register).
template <int Slots>
class UnitQueue {
 public:
  struct SharedStorage {
    cutlass::arch::ClusterBarrier full[Slots];   // a unit pushed
    cutlass::arch::ClusterBarrier empty[Slots];  // every consumer warp has read it
    int units[Slots];
  };

  // Initialized by warp 0, before the kernel's barrier that publishes its mbarriers.
  CUTLASS_DEVICE explicit UnitQueue(SharedStorage& storage) : storage_(storage) {
    if (cutlass::canonical_warp_idx_sync() == 0 && cute::elect_one_sync()) {
      for (int slot = 0; slot < Slots; ++slot) {
        storage_.full[slot].init(1);
        storage_.empty[slot].init(kConsumerWarps);
      }
    }
    cutlass::arch::fence_barrier_init();
  }

  // Lane 0 of the producer warp; `pushed` counts its pushes.
  CUTLASS_DEVICE void push(uint32_t& pushed, int unit) {
    const uint32_t slot = pushed % Slots;
    storage_.empty[slot].wait(((pushed / Slots) & 1) ^ 1);
    storage_.units[slot] = unit;
    storage_.full[slot].arrive();
    ++pushed;
  }

  // Every thread of both consumer warpgroups; `popped` counts the caller's pops. A warp
  // frees the slot once all its lanes have read it.
  CUTLASS_DEVICE int pop(uint32_t& popped) {
    const uint32_t slot = popped % Slots;
    storage_.full[slot].wait((popped / Slots) & 1);
    const int unit = storage_.units[slot];
    __syncwarp();
    if (cutlass::canonical_lane_idx() == 0) storage_.empty[slot].arrive();
    ++popped;
    return unit;
  }

 private:
  static constexpr uint32_t kConsumerWarps = 2 * cutlass::NumWarpsPerWarpGroup;
  SharedStorage& storage_;
};

}  // namespace cutlassfuse::sm90
