// Layout conversions: the deconvolution's input from NCDHW (PyTorch's default) to the
// NDHWC the tensor-core kernel reads through TMA, the backward's tensors both ways, one
// pass at memory bandwidth (ATen's generic permuted copy runs at a fifth of it on this
// access pattern), with float32 split into bfloat16 pieces or scaled to float16 at
// TF32's precision on the way; the bias repeated per block of the pixel-shuffle GEMM's columns.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cutlassfuse/common/tf32_scaling.h"
#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// src: [batch, channels, spatial] packed; dst: [batch, spatial, channels] packed.
// channels must be a multiple of 8 (16-byte stores).
void ncdhw_to_ndhwc(ElementType element, const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial,
                    cudaStream_t stream);

// The inverse: src [batch, spatial, channels] packed; dst [batch, channels, spatial] packed.
// channels % 8 == 0 (16-byte loads).
void ndhwc_to_ncdhw(ElementType element, const void* src, void* dst, int64_t batch, int64_t channels, int64_t spatial,
                    cudaStream_t stream);

// The float32 path's left operand in one pass: src float32, [batch, channels, spatial]
// (NCDHW) or [batch, spatial, channels] (channels_last_source); dst bfloat16
// [batch, spatial, kProducts * channels], channel block b holding piece input_piece(b)
// of each value (float32_split.h). channels % 8 == 0.
void split_float32_ndhwc(const void* src, bool channels_last_source, void* dst, int64_t batch, int64_t channels,
                         int64_t spatial, cudaStream_t stream);

// The float32 path's right operand in one pass: src float32, numel values in any
// order; dst bfloat16 [kProducts, numel], block b holding piece filter_piece(b) of each
// value (float32_split.h).
void split_float32_filter(const void* src, int64_t numel, void* dst, cudaStream_t stream);

// The TF32 path's left operand in one pass: src float32, [batch, channels, spatial]
// (NCDHW) or [batch, spatial, channels] (channels_last_source); dst float16
// [batch, spatial, channels], each value scaled by 2^e_input and rounded to nearest
// (tf32_scaling.h; after measure_tf32_operands on the stream). channels % 8 == 0.
void scale_tf32_ndhwc(const void* src, bool channels_last_source, const Tf32OperandScales* scales, void* dst,
                      int64_t batch, int64_t channels, int64_t spatial, cudaStream_t stream);

// src float16/bfloat16, [batch, channels, spatial] (NCDHW) or [batch, spatial, channels]
// (channels_last_source), packed; dst [batch, spatial, padded_channels], zeros in the
// channels from `channels` on: a layer's input or weight made a tensor-core convolution's
// (16-bit channels in multiples of 8) in one pass. padded_channels % 8 == 0.
void pad_channels_ndhwc(ElementType element, const void* src, bool channels_last_source, void* dst, int64_t batch,
                        int64_t channels, int64_t padded_channels, int64_t spatial, cudaStream_t stream);

// dst[i * row_bytes + j] = row[j] for i < copies, j < row_bytes.
void repeat_row(const void* row, int64_t row_bytes, int64_t copies, void* dst, cudaStream_t stream);

}  // namespace cutlassfuse
