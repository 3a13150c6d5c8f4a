// Which layers the conv-gradient kernels take (sm90/conv_gradients.h): CUTLASS's sm90
// im2col limits (collective can_implement) stated on the layer, so that the caller
// picks cuDNN before anything launches; and where they are preferred to cuDNN.
#include <algorithm>
#include <limits>

#include "cutlassfuse/sm90/conv_gradients.h"

namespace cutlassfuse::sm90 {

std::string conv_gradient_rejection(const Problem& p) {
  if (p.conv_groups != 1) return "conv groups";
  if (p.in_channels % 8 != 0 || p.out_channels % 8 != 0) return "channel counts not multiples of 8";
  constexpr int64_t kMax32 = std::numeric_limits<int32_t>::max();
  if (p.batch * p.output_spatial() * p.out_channels > kMax32 || p.batch * p.input_spatial() * p.in_channels > kMax32)
    return "tensors of more than 2^31 elements";
  for (int i = 0; i < 3; ++i) {
    const int64_t reach = p.dilation[i] * (p.kernel_size[i] - 1);
    const int64_t upper = std::max<int64_t>(0, p.padding[i] - p.output_padding[i]);
    if (p.stride[i] > 8) return "strides over 8 (TMA's im2col element stride)";
    if (p.padding[i] > 16) return "padding over 16";
    if (reach > 30) return "a filter reach over 30";
    if (upper - reach < -16 || upper - reach > 15) return "an im2col corner outside [-16, 15]";
    // CUTLASS derives the input gradient's extent from dz's; it must be the input's.
    if ((p.output_size[i] + p.padding[i] + upper - reach - 1) / p.stride[i] + 1 != p.input_size[i])
      return "an output padding no non-negative upper padding expresses";
  }
  return "";
}

namespace {

constexpr int64_t kChannelTile = 128;  // the kernels' tile along the channels of x
// Weight-gradient output tiles from which the kernel beat cuDNN (docs/performance.md): on
// strided layers wins at 128 and more tiles, ties and losses at 32 and fewer.
constexpr int64_t kMinWeightGradientTiles = 96;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool strided_with_full_channel_tiles(const Problem& p) {
  const bool strided = p.stride[0] > 1 || p.stride[1] > 1 || p.stride[2] > 1;
  return strided && p.in_channels % kChannelTile == 0;
}

}  // namespace

bool input_gradient_preferred(const Problem& p) { return strided_with_full_channel_tiles(p); }

bool weight_gradient_preferred(const Problem& p) {
  // The weight gradient's GEMM: M = in_channels, N = taps * out_channels.
  const int64_t n = p.kernel_size[0] * p.kernel_size[1] * p.kernel_size[2] * p.out_channels;
  const int64_t tiles = ceil_div(p.in_channels, kChannelTile) * ceil_div(n, kChannelTile);
  return strided_with_full_channel_tiles(p) && tiles >= kMinWeightGradientTiles;
}

}  // namespace cutlassfuse::sm90
