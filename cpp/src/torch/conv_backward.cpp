#include "torch/conv_backward.h"

#include <algorithm>

namespace cutlassfuse {
namespace {

bool is_pixel_shuffle(const at::Tensor& weight, const ConvTransposeShape& s) {
  const auto zero = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 0; });
  };
  const auto one = [](const std::vector<int64_t>& v) {
    return std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 1; });
  };
  if (s.groups != 1 || !zero(s.padding) || !zero(s.output_padding) || !one(s.dilation)) return false;
  for (int i = 0; i < 3; ++i) {
    if (weight.sym_size(2 + i) != s.stride[i]) return false;
  }
  return true;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> conv_transpose3d_backward(const at::Tensor& dz, const at::Tensor& input,
                                                            const at::Tensor& weight, const ConvTransposeShape& s,
                                                            std::array<bool, 2> need) {
  if (!is_pixel_shuffle(weight, s)) {
    const auto [grad_input, grad_weight, unused] = at::convolution_backward_symint(
        dz, input, weight, std::nullopt, c10::fromIntArrayRefSlow(s.stride), c10::fromIntArrayRefSlow(s.padding),
        c10::fromIntArrayRefSlow(s.dilation), /*transposed=*/true, c10::fromIntArrayRefSlow(s.output_padding), s.groups,
        {need[0], need[1], false});
    return {grad_input, grad_weight};
  }
  const c10::SymInt n = input.sym_size(0), cin = input.sym_size(1), d = input.sym_size(2), h = input.sym_size(3),
                    w = input.sym_size(4), cout = weight.sym_size(1);
  const c10::SymInt s0 = weight.sym_size(2), s1 = weight.sym_size(3), s2 = weight.sym_size(4);
  const c10::SymInt pixels = n * d * h * w, columns = s0 * s1 * s2 * cout;
  // dz [N, Cout, D s0, H s1, W s2] as [pixels, (s0, s1, s2, Cout)]: one copy, or none
  // beyond the permutation's when dz is channels-last.
  const at::Tensor blocks = dz.permute({0, 2, 3, 4, 1})
                                .reshape_symint({n, d, s0, h, s1, w, s2, cout})
                                .permute({0, 1, 3, 5, 2, 4, 6, 7})
                                .reshape_symint({pixels, columns});
  at::Tensor grad_input, grad_weight;
  if (need[0]) {
    const at::Tensor filter = weight.permute({0, 2, 3, 4, 1}).reshape_symint({cin, columns});
    grad_input = at::mm(blocks, filter.t()).view_symint({n, d, h, w, cin}).permute({0, 4, 1, 2, 3});
  }
  if (need[1]) {
    const at::Tensor x = input.permute({0, 2, 3, 4, 1}).reshape_symint({pixels, cin});
    grad_weight = at::mm(x.t(), blocks).view_symint({cin, s0, s1, s2, cout}).permute({0, 4, 1, 2, 3}).contiguous();
  }
  return {grad_input, grad_weight};
}

}  // namespace cutlassfuse
