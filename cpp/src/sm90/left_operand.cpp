#include "sm90/left_operand.h"

#include <array>
#include <vector>

#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/nvtx.h"

namespace cutlassfuse::sm90 {

LeftOperand::LeftOperand(const at::Tensor& input, MathMode math, const Problem& p, bool pixel_major,
                         CallWorkspace& workspace)
    : input_(input), math_(math), problem_(p), channels_last_(input.is_contiguous(at::MemoryFormat::ChannelsLast3d)) {
  if (math == MathMode::kFloat32AsBf16x3) {
    converted_ = workspace.reserve(gemm_in_channels(math, p.input_numel()) * c10::elementSize(at::kBFloat16));
  } else if (math == MathMode::kFloat32AsTf32 || (!channels_last_ && !pixel_major)) {
    converted_ = workspace.reserve(input.nbytes());
  }
}

const void* LeftOperand::prepare(const CallWorkspace& workspace, cudaStream_t stream) const {
  if (!converted_) return input_.data_ptr();
  const at::Tensor src = channels_last_ ? input_ : input_.contiguous();
  void* dst = workspace.at(*converted_);
  const Problem& p = problem_;
  if (math_ == MathMode::kFloat32AsBf16x3) {
    const NvtxRange range("cutlassfuse.split_float32");
    split_float32_ndhwc(src.data_ptr(), channels_last_, dst, p.batch, p.in_channels, p.input_spatial(), stream);
  } else if (math_ == MathMode::kFloat32AsTf32) {
    const NvtxRange range("cutlassfuse.round_tf32");
    round_tf32_ndhwc(src.data_ptr(), channels_last_, dst, p.batch, p.in_channels, p.input_spatial(), stream);
  } else {
    const NvtxRange range("cutlassfuse.ncdhw_to_ndhwc");
    ncdhw_to_ndhwc(activation_element(math_), src.data_ptr(), dst, p.batch, p.in_channels, p.input_spatial(), stream);
  }
  return dst;
}

namespace {

at::Tensor split_filter(const at::Tensor& packed) {
  std::array<at::Tensor, float32_split::kPieces> pieces;
  at::Tensor rest = packed;
  for (auto& piece : pieces) {
    piece = rest.to(at::kBFloat16);
    // A non-finite value is all in its first piece (inf - inf would make the rest NaN).
    rest = at::nan_to_num(rest - piece.to(at::kFloat), 0.0, 0.0, 0.0);
  }
  std::vector<at::Tensor> blocks;
  for (int block = 0; block < float32_split::kProducts; ++block) {
    blocks.push_back(pieces[float32_split::filter_piece(block)]);
  }
  return at::cat(blocks, 0);
}

// The packed filter [Cin, T, R, S, Cout] as `conv`'s forward convolutions read it: the
// dgrad's filter [Cin, T', R', S', Cout'] of `conv` (for the pixel-shuffle GEMM, 1x1x1
// with the blocks' channels side by side), taps reversed, packed [Cout', T', R', S', Cin].
at::Tensor forward_filter_tf32(const at::Tensor& packed, const Problem& conv, cudaStream_t stream) {
  const auto& k = conv.kernel_size;
  at::Tensor filter = at::empty({conv.out_channels, k[0], k[1], k[2], conv.in_channels}, packed.options());
  reverse_filter_tf32(packed.data_ptr(), filter.data_ptr(), conv.in_channels, k, conv.out_channels, stream);
  return filter;
}

}  // namespace

at::Tensor right_operand(const OpArgs& a, MathMode math, const Problem& conv, cudaStream_t stream) {
  const at::Tensor packed =
      present(a.packed_weight) ? a.packed_weight->contiguous() : a.weight.permute({0, 2, 3, 4, 1}).contiguous();
  switch (math) {
    case MathMode::kFloat32AsBf16x3: return split_filter(packed);
    case MathMode::kFloat32AsTf32: {
      const NvtxRange range("cutlassfuse.forward_filter_tf32");
      return forward_filter_tf32(packed, conv, stream);
    }
    default: return packed;
  }
}

}  // namespace cutlassfuse::sm90
