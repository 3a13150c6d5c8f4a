// NVTX ranges around the op's stages, so Nsight Systems timelines and
// `ncu --nvtx --nvtx-include "cutlassfuse/..."` see them. NVTX v3 is header-only and
// costs a few nanoseconds per range when no tool is attached.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace cutlassfuse {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace cutlassfuse
