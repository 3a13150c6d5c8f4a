// GroupNorm with its activations in one cooperative launch, for a tensor that the
// GPU holds on chip (group_norm_resident.cu): its shared memory (on an H100 or H200
// about 29 MB, 14M elements of 16 bits), and past that, for 16-bit tensors, up to three
// quarters of L2 more (SegResNet's 67 MB first norm at 128^3, on an H100's 50 MB L2 as
// on an H200's 60 MB). The separate statistics, finalize and normalize launches
// (group_norm_generic.h) read the tensor twice from DRAM; here every block
//   1. copies its part of the tensor into shared memory, or where the part is larger,
//      its first vectors, and reads the rest so that L2 keeps it, summing pre(y);
//   2. waits at a grid barrier for every block's partial statistics, which one warp per
//      (sample, group) then merges in a fixed order (bitwise repeatable, no atomics),
//      and at a second one for the means and rstds;
//   3. normalizes its part, the streamed rest read again from L2, then the rest from
//      shared memory.
// One launch instead of three also saves host time per call. Taken for packed NCDHW
// (pixels per sample a multiple of kVector) or NDHWC (channels a power of two from 8 to
// 256) tensors with 16-byte aligned pointers, written in the input's layout, when every
// block of the launch is resident at once and the parts' streamed rests fit in L2.
#pragma once

#include <cuda_runtime_api.h>

#include <optional>

#include "cutlassfuse/norm/group_norm_generic.h"

namespace cutlassfuse {

// What one resident launch reads and writes.
struct ResidentNormCall {
  ElementType element;
  const void* y;
  ActivationLayout layout;
  PreNorm pre;
  ActivationParams after;
  GroupNormShape shape;
  GroupNormAffine affine;
  float eps;
  void* out;              // y's layout; may be y (in place)
  const void* residual;   // added to the output: out's layout; null: none
  void* workspace;        // ResidentNormPlan::workspace_bytes()
  float* mean = nullptr;  // [batch, groups], written when not null
  float* rstd = nullptr;  // likewise
};

// How a launch splits the tensor: into `parts` blocks a unit, a (sample, group) span for
// NCDHW, a sample for NDHWC, each block keeping one partial per (sample, group) it holds;
// the workspace holds the partials, then each (sample, group)'s mean and rstd.
struct ResidentNormPlan {
  int64_t units;
  int parts;
  int64_t part_length;  // of a unit, a block's: NCDHW vectors of kVector elements, NDHWC rows
  int64_t kept;         // vectors of a part its block's shared memory holds; the rest streams
  int64_t groups;       // batch x num_groups

  int64_t partials_bytes() const { return (groups * parts * int64_t{sizeof(WelfordPartial)} + 15) / 16 * 16; }
  int64_t workspace_bytes() const { return partials_bytes() + groups * int64_t{sizeof(float2)}; }
};

// The plan on the current device, or nothing where the call is not one the resident
// kernel takes (see above): the GPU cannot hold one block per unit at once, or the
// parts' rests past shared memory are more than L2 keeps.
std::optional<ResidentNormPlan> plan_resident_norm(const ResidentNormCall& call);

// Runs `call` as `plan` says. False where the GPU refused the cooperative launch (its
// blocks could not all be resident, as when the GPU's SMs are partitioned): nothing ran.
bool norm_activation_resident(const ResidentNormCall& call, const ResidentNormPlan& plan, cudaStream_t stream);

}  // namespace cutlassfuse
