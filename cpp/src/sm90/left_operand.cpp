#include "sm90/left_operand.h"

#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/nvtx.h"

namespace cutlassfuse::sm90 {

LeftOperand::LeftOperand(const at::Tensor& input, MathMode math, const Problem& p, bool pixel_major,
                         CallWorkspace& workspace)
    : math_(math), problem_(p), channels_last_(input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
  source_ = channels_last_ ? input : input.contiguous();
  if (math == MathMode::kFloat32AsBf16x3) {
    converted_ = workspace.reserve(gemm_in_channels(math, p.input_numel()) * c10::elementSize(at::kBFloat16));
  } else if (math == MathMode::kFloat32AsTf32) {
    converted_ = workspace.reserve(p.input_numel() * c10::elementSize(at::kHalf));
  } else if (!channels_last_ && !pixel_major) {
    converted_ = workspace.reserve(input.nbytes());
  }
}

const void* LeftOperand::prepare(const CallWorkspace& workspace, const Tf32OperandScales* scales,
                                 cudaStream_t stream) const {
  if (!converted_) return source_.data_ptr();
  const void* src = source_.data_ptr();
  void* dst = workspace.at(*converted_);
  const Problem& p = problem_;
  if (math_ == MathMode::kFloat32AsBf16x3) {
    const NvtxRange range("cutlassfuse.split_float32");
    split_float32_ndhwc(src, channels_last_, dst, p.batch, p.in_channels, p.input_spatial(), stream);
  } else if (math_ == MathMode::kFloat32AsTf32) {
    TORCH_INTERNAL_ASSERT(scales != nullptr, "the TF32 operand needs the call's scales");
    const NvtxRange range("cutlassfuse.scale_tf32");
    scale_tf32_ndhwc(src, channels_last_, scales, dst, p.batch, p.in_channels, p.input_spatial(), stream);
  } else {
    const NvtxRange range("cutlassfuse.ncdhw_to_ndhwc");
    ncdhw_to_ndhwc(activation_element(math_), src, dst, p.batch, p.in_channels, p.input_spatial(), stream);
  }
  return dst;
}

namespace {

at::Tensor split_filter(const at::Tensor& packed, cudaStream_t stream) {
  at::Tensor filter = at::empty(
      {float32_split::kProducts * packed.size(0), packed.size(1), packed.size(2), packed.size(3), packed.size(4)},
      packed.options().dtype(at::kBFloat16));
  split_float32_filter(packed.data_ptr(), packed.numel(), filter.data_ptr(), stream);
  return filter;
}

at::Tensor scaled_filter(const at::Tensor& packed, Tf32OperandScales* scales, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(scales != nullptr, "the TF32 filter needs the call's scales");
  at::Tensor filter = at::empty(packed.sizes(), packed.options().dtype(at::kHalf));
  scale_filter_tf32(packed.data_ptr(), packed.numel(), scales, filter.data_ptr(), stream);
  return filter;
}

}  // namespace

at::Tensor packed_filter(const OpArgs& a) {
  return present(a.packed_weight) ? a.packed_weight->contiguous() : a.weight.permute({0, 2, 3, 4, 1}).contiguous();
}

at::Tensor right_operand(const at::Tensor& packed, MathMode math, Tf32OperandScales* scales, cudaStream_t stream) {
  switch (math) {
    case MathMode::kFloat32AsBf16x3: {
      const NvtxRange range("cutlassfuse.split_float32_filter");
      return split_filter(packed, stream);
    }
    case MathMode::kFloat32AsTf32: {
      const NvtxRange range("cutlassfuse.scale_filter_tf32");
      return scaled_filter(packed, scales, stream);
    }
    default: return packed;
  }
}

}  // namespace cutlassfuse::sm90
