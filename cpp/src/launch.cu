// When kernels may be launched programmatically. See cutlassfuse/launch.h and launch.cuh.
#include <cuda_runtime.h>

#include <array>
#include <atomic>

#include "cutlassfuse/launch.h"

namespace cutlassfuse {
namespace {

std::atomic<bool> g_programmatic_launch{true};

// Compiled like every kernel of this target: the code the device runs for it tells
// which virtual architecture the project's kernels were generated from.
__global__ void architecture_probe_kernel() {}

enum class Support : int { kUnknown, kYes, kNo };
constexpr int kMaxDevices = 64;

bool device_runs_sm90_code(int device) {
  static std::array<std::atomic<Support>, kMaxDevices> known{};
  if (device < 0 || device >= kMaxDevices) return false;
  Support support = known[device].load(std::memory_order_relaxed);
  if (support == Support::kUnknown) {
    cudaFuncAttributes attributes{};
    const bool yes = cudaFuncGetAttributes(&attributes, architecture_probe_kernel) == cudaSuccess &&
                     attributes.ptxVersion >= 90 && attributes.binaryVersion >= 90;
    support = yes ? Support::kYes : Support::kNo;
    known[device].store(support, std::memory_order_relaxed);
  }
  return support == Support::kYes;
}

}  // namespace

bool programmatic_launch_enabled() {
  if (!g_programmatic_launch.load(std::memory_order_relaxed)) return false;
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess && device_runs_sm90_code(device);
}

void set_programmatic_launch(bool enabled) { g_programmatic_launch.store(enabled, std::memory_order_relaxed); }

}  // namespace cutlassfuse
