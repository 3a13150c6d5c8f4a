// Nearest upsampling of a packed 5-D tensor as PyTorch's (F.interpolate(x, ...,
// mode="nearest") on 5-D input, aten::upsample_nearest3d): output index o of a dimension
// copies input index min(floor(o * scale), in - 1) in float32, scale being 1 / the given
// scale factor, or in / out without one. Video autoencoders upsample every activation
// this way (diffusers' HunyuanVideo upsampling blocks); ATen's CUDA kernel for it runs at a
// tenth of memory bandwidth, NCDHW only.
//
// The copy moves bits, one kernel per element size: NDHWC copies each output pixel's
// channels from its source pixel in the widest units the pixel's bytes and the pointers
// allow; NCDHW gathers 16 bytes of the output element by element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace cutlassfuse {

struct UpsampleNearest3d {
  int64_t batch;
  int64_t channels;
  int64_t input[3];   // D, H, W
  int64_t output[3];  // D, H, W
  float scale[3];     // the source index per output index, per dimension (ATen's float scale)
  // Causal frames (video autoencoders' upsampling): output frame 0 copies input frame 0,
  // output frame o > 0 the later frames' nearest source of o - 1, 1 + min(floor((o - 1) *
  // scale[0]), input[0] - 2), as upsampling the frames after the first apart does.
  bool causal_frames = false;

  int64_t input_elements() const { return batch * channels * input[0] * input[1] * input[2]; }
  int64_t output_elements() const { return batch * channels * output[0] * output[1] * output[2]; }
};

// ATen's scale of a dimension: 1 / `scale_factor` where one above zero is given, else
// input / output, as float32.
float upsample_nearest_scale(double scale_factor, bool given, int64_t input, int64_t output);

// Whether upsample_nearest3d takes `p` of elements of `element_bytes` (1, 2, 4, 8 or
// 16): non-empty tensors of fewer than 2^31 elements. The pointers must be aligned to
// their elements.
bool upsample_nearest3d_takes(const UpsampleNearest3d& p, int64_t element_bytes);

// dst (packed, the layout of src: NDHWC when channels_last, else NCDHW) = src upsampled.
void upsample_nearest3d(const void* src, void* dst, int64_t element_bytes, bool channels_last,
                        const UpsampleNearest3d& p, cudaStream_t stream);

}  // namespace cutlassfuse
