// Which units (PhaseTiles) each CTA of a ping-pong launch computes, and how its
// producer warp hands them to the two consumer warpgroups.
//
// Why a CTA draws units at run time: a unit's K blocks are those of the depth taps that
// reach its pixels (tap_window.h), so units differ in work by up to 3x, and a static
// walk (CTA c takes units c, c + G, c + 2G, ..., G the CTAs of the grid) hands some CTAs
// more blocks than others. The launch ends with its busiest CTA: with the static walk
// that CTA runs 1.41x the average K blocks on kb61_v0 (405 tiles on 132 CTAs) and 1.05x
// on kb61; drawing the next unit when the producer reaches it, 1.15x and 1.01x. Clusters
// keep the static walk: their CTAs must take the same units in step.
//
// The counter (UnitCounter, dgrad_sm90.h) lives in the call's workspace, memory nobody
// zeroed. CTA 0 initializes it as it starts: the draw count to zero, then the launch's
// epoch, a 64-bit value the host draws per launch. A CTA takes its first two units
// statically (one per consumer) and draws only once it has read the epoch, so no launch
// needs a memset before it. The CTA drawing the launch's last ticket clears the epoch:
// a CUDA graph replays a launch with the same counter and epoch, and the next replay must
// find the counter uninitialized again.
#pragma once

#include <cute/arch/util.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include <atomic>
#include <cstdint>
#include <random>

#include "cutlassfuse/dgrad_sm90.h"

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

// The static walk serves clusters, launches of at most two units per CTA (the ones every
// CTA takes statically anyway) and set_drawn_tile_schedule(false): `counter` otherwise,
// with a fresh epoch.
inline UnitSchedule unit_schedule(UnitCounter* counter, int cluster_size, int units, int grid_units) {
  if (counter == nullptr || cluster_size > 1 || units <= 2 * grid_units || !drawn_tile_schedule()) return {};
  return {counter, next_launch_epoch()};
}

// The producer warp's units in order, then `total` forever: each call of take() returns
// the unit held and draws the one after it, whose atomic's latency then overlaps the
// held unit's loads. Lane 0 draws (and keeps whether it saw the epoch); every lane gets
// the unit.
class UnitSource {
 public:
  CUTLASS_DEVICE UnitSource(UnitSchedule const& schedule, int first, int stride, int total)
      : schedule_(schedule), stride_(stride), total_(total), held_(first) {
    if (schedule_.counter != nullptr && first == 0 && cutlass::canonical_lane_idx() == 0) {
      schedule_.counter->drawn = 0;
      // The draw count's reset, then the epoch that lets the other CTAs draw.
      asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(&schedule_.counter->epoch), "l"(schedule_.epoch)
                   : "memory");
    }
  }

  CUTLASS_DEVICE int take() {
    const int unit = held_;
    if (unit < total_) held_ = following(unit);
    return unit;
  }

 private:
  CUTLASS_DEVICE int following(int unit) {
    const bool first_of_cta = unit < stride_;
    if (schedule_.counter == nullptr || first_of_cta) return min(unit + stride_, total_);
    int drawn = 0;
    if (cutlass::canonical_lane_idx() == 0) drawn = draw();
    return __shfl_sync(0xffffffffu, drawn, 0);
  }

  // Units 2G on are drawn: ticket t is unit 2G + t. Each CTA that draws at all draws
  // exactly one ticket past the units, so the launch draws units - 2G + drawing CTAs
  // tickets, and the one who draws the last clears the epoch.
  CUTLASS_DEVICE int draw() {
    UnitCounter* counter = schedule_.counter;
    while (!epoch_seen_) {
      uint64_t epoch;
      asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(epoch) : "l"(&counter->epoch) : "memory");
      epoch_seen_ = epoch == schedule_.epoch;
      if (!epoch_seen_) __nanosleep(64);
    }
    const int ticket = atomicAdd(&counter->drawn, 1);
    const int drawing_ctas = min(max(total_ - stride_, 0), stride_);
    const int last_ticket = max(total_ - 2 * stride_, 0) + drawing_ctas - 1;
    if (ticket == last_ticket) {
      asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(&counter->epoch), "l"(uint64_t{0}) : "memory");
    }
    return min(2 * stride_ + ticket, total_);
  }

  UnitSchedule const& schedule_;
  int stride_;
  int total_;
  int held_;
  bool epoch_seen_ = false;
};

// The units a CTA's producer hands its consumers, in order, a few ahead. Both consumers
// read every unit: their own, and the other's, whose pipeline stages they skip. After
// the last unit the producer pushes `total` twice: the consumer of the unit after the
// last reads one as its own, the other reads the first to skip and the second as its own.
template <int Slots>
class UnitQueue {
 public:
  using Pipeline = cutlass::PipelineAsync<Slots>;
  using State = typename Pipeline::PipelineState;

  struct SharedStorage {
    typename Pipeline::SharedStorage barriers;
    int units[Slots];
  };

  CUTLASS_DEVICE UnitQueue(SharedStorage& storage, bool producer_warp, bool consumer)
      : storage_(storage), pipeline_(storage.barriers, params(producer_warp, consumer)) {}

  // Lane 0 of the producer warp.
  CUTLASS_DEVICE void push(State& state, int unit) {
    pipeline_.producer_acquire(state);
    storage_.units[state.index()] = unit;
    pipeline_.producer_commit(state);
    ++state;
  }

  // Every thread of both consumer warpgroups.
  CUTLASS_DEVICE int pop(State& state) {
    pipeline_.consumer_wait(state);
    const int unit = storage_.units[state.index()];
    pipeline_.consumer_release(state);
    ++state;
    return unit;
  }

  static CUTLASS_DEVICE State producer_start() { return cutlass::make_producer_start_state<Pipeline>(); }

 private:
  static CUTLASS_DEVICE typename Pipeline::Params params(bool producer_warp, bool consumer) {
    typename Pipeline::Params p;
    if (producer_warp) p.role = Pipeline::ThreadCategory::Producer;
    if (consumer) p.role = Pipeline::ThreadCategory::Consumer;
    p.producer_arv_count = 1;
    p.consumer_arv_count = 2 * cutlass::NumThreadsPerWarpGroup;
    return p;
  }

  SharedStorage& storage_;
  Pipeline pipeline_;
};

}  // namespace cutlassfuse::sm90
