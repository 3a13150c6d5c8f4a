// Named ranges around the op's stages, seen by both kinds of profilers users run:
// NVTX for Nsight Systems timelines and `ncu --nvtx --nvtx-include "cutlassfuse/..."`,
// and a RecordFunction scope for torch.profiler, whose CPU-side tables then show what
// each stage costs the host. Both cost a few nanoseconds when no profiler is active.
#pragma once

#include <ATen/record_function.h>
#include <nvtx3/nvToolsExt.h>

namespace cutlassfuse {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) : record_(at::RecordScope::USER_SCOPE) {
    nvtxRangePushA(name);
    if (record_.isActive()) record_.before(name);
  }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  at::RecordFunction record_;
};

}  // namespace cutlassfuse
