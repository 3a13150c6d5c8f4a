// Replicate padding of a packed 5-D tensor (F.pad(x, pad, mode="replicate") with six
// pads): each output element copies the input element at its index clamped into the
// input's extent, per spatial dimension. Video autoencoders' causal convolutions pad
// every input this way before a Conv3d without padding (diffusers'
// HunyuanVideoCausalConv3d); ATen's kernel for it computes a 64-bit index per element
// and runs far below memory bandwidth.
//
// The copy moves bits, so one kernel serves every dtype of an element size: NDHWC copies
// each output pixel's channels from its source pixel in the widest units (up to 16
// bytes) that the pixel's bytes and the pointers' alignment allow; NCDHW assembles whole
// output rows in shared memory (their source rows loaded in wide units and shifted into
// place, the pads copied from the rows' ends) and writes them out in 16-byte chunks.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cutlassfuse {

struct ReplicationPad3d {
  int64_t batch;
  int64_t channels;
  int64_t input[3];   // D, H, W
  int64_t before[3];  // the pads in front of D, above H, left of W
  int64_t after[3];   // the pads behind D, below H, right of W

  int64_t output(int dim) const { return input[dim] + before[dim] + after[dim]; }
  int64_t input_elements() const { return batch * channels * input[0] * input[1] * input[2]; }
  int64_t output_elements() const { return batch * channels * output(0) * output(1) * output(2); }
};

// Whether replication_pad3d takes `pad` of elements of `element_bytes` (1, 2, 4, 8 or
// 16): a non-empty input, non-negative pads, both tensors of fewer than 2^31 elements.
// The pointers must be aligned to their elements.
bool replication_pad3d_takes(const ReplicationPad3d& pad, int64_t element_bytes);

// dst (packed, the layout of src: NDHWC when channels_last, else NCDHW) = src padded.
void replication_pad3d(const void* src, void* dst, int64_t element_bytes, bool channels_last,
                       const ReplicationPad3d& pad, cudaStream_t stream);

}  // namespace cutlassfuse
