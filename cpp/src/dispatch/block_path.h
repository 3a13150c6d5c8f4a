// The seam between the block family's ops (block.h) and their CUDA kernel paths, as
// kernel_path.h is for the op: a path plans a call or says why it does not take it;
// the routing table (block_routing.cpp) asks each in order of preference, and a call
// none takes runs ATen's composite.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <variant>

#include "cutlassfuse/block.h"
#include "cutlassfuse/settings.h"

namespace cutlassfuse {

struct BlockCall {
  const ConvNormActivationArgs& args;
  const BlockProblem& problem;
  const CallOptions& options;
  // A backward follows: the call also returns what it reads (BlockForBackward).
  bool keep_for_backward = false;
};

// A kernel path's plan for one call.
class PlannedBlock {
 public:
  virtual ~PlannedBlock() = default;
  virtual std::string description() const = 0;  // for explain()
  // Launches on the current stream; mean, rstd and the convolution's output when the
  // call keeps them.
  virtual BlockForBackward run() const = 0;
};

using BlockRouting = std::variant<std::unique_ptr<PlannedBlock>, std::string>;

struct BlockKernelPath {
  const char* name;  // explain()'s prefix
  BlockRouting (*plan)(const BlockCall& call);
};

}  // namespace cutlassfuse
