// The seam between the op and its CUDA kernel paths. A kernel path (one folder of
// src/) plans a call or says why it does not take it; the routing table
// (routing.cpp) asks each in order of preference, and a call none takes runs ATen's
// composite. Adding a path is its folder and a table entry.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <variant>

#include "cutlassfuse/op.h"
#include "cutlassfuse/settings.h"

namespace cutlassfuse {

// One CUDA call as the kernel paths see it: the op's arguments, the resolved problem
// and the settings it runs under, all alive for the call.
struct Call {
  const OpArgs& args;
  const Problem& problem;
  const CallOptions& options;
  // A backward follows: the call also returns what it reads (ForwardOutputs).
  bool keep_for_backward = false;
  // Which tensor it keeps for the backward besides mean and rstd (op.h).
  KeptTensor kept = KeptTensor::kActivation;
};

// A call's results: the op's output and, when the call keeps them, what the backward
// reads.
struct ForwardOutputs {
  at::Tensor out;
  // The call's KeptTensor (op.h).
  at::Tensor kept;
  at::Tensor mean;  // [batch, num_groups] float32 (the kernels take no float64), of the activation
  at::Tensor rstd;  // [batch, num_groups] float32
};

// A kernel path's plan for one call.
class PlannedCall {
 public:
  virtual ~PlannedCall() = default;
  // What the launches are, for explain().
  virtual std::string description() const = 0;
  // Launches on the current stream.
  virtual ForwardOutputs run() const = 0;
};

// The plan, or why the path does not take the call.
using Routing = std::variant<std::unique_ptr<PlannedCall>, std::string>;

struct KernelPath {
  const char* name;  // explain()'s prefix
  Routing (*plan)(const Call& call);
};

}  // namespace cutlassfuse
