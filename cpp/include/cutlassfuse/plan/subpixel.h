// Sub-pixel phase decomposition: ConvTranspose3d of any stride, padding,
// output_padding and dilation as a set of unit-stride deconvolutions (CUTLASS dgrad
// problems), each reading a cropped view of the input and a strided view of the filter
// and writing a strided view of the output. Plain C++: the CUDA dispatch launches the
// plan, and a CPU test (tests/test_subpixel_plan.py) executes the very same plan with
// ATen to prove it equals F.conv_transpose3d.
//
// Along one dimension, y[o] = sum over (i, t) with o = i*s - p + t*d of x[i] w[t].
// Outputs of phase phi = (o + p) mod s are reached only by the taps t with
// t*d = phi (mod s): t0, t0 + s/g, ... (g = gcd(d, s)), which step through the input
// with sub-dilation d/g. Writing o = o0 + s*k, phase output k reads
// x[k + lower - j*(d/g)] * w[t0 + j*s/g]: a unit-stride deconvolution with lower
// padding `lower`. Outputs of a phase that no input reaches (near the borders, or every
// output of a phase without taps when kernel < stride) are trimmed from the problem;
// they hold only the bias, and the caller writes them separately.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "cutlassfuse/plan/problem.h"

namespace cutlassfuse {

// One phase along one dimension, already trimmed to the outputs some input reaches.
struct PhaseExtent {
  int64_t first_output;  // o0: the phase's first output index; its outputs are o0 + stride * k
  int64_t count;         // outputs k = 0 .. count - 1
  int64_t tap_begin;     // kernel taps tap_begin + tap_step * j, j = 0 .. tap_count - 1
  int64_t tap_step;
  int64_t tap_count;
  int64_t dilation;     // of the sub-kernel, in input positions
  int64_t input_begin;  // the phase reads input positions input_begin .. + input_count - 1
  int64_t input_count;
  int64_t lower_padding;  // output k reads cropped input k + lower_padding - dilation * j
  int64_t upper_padding;  // input_count = count + lower + upper - dilation * (tap_count - 1)
};

// The phases of one dimension that receive at least one tap, in phase order.
std::vector<PhaseExtent> plan_dimension(int64_t input, int64_t kernel, int64_t stride, int64_t padding,
                                        int64_t output_padding, int64_t dilation);

// A view of a packed channels-last tensor: element offset, extents and strides of the
// (outer, d, h, w) modes; channels are contiguous. For the filter [Cin, T, R, S, Cout]
// the outer mode is Cin (extent not repeated here).
struct StridedView {
  int64_t offset = 0;
  Extent3 extent{};
  std::array<int64_t, 4> stride{};

  bool operator==(const StridedView&) const = default;
};

// One unit-stride dgrad: ConvTranspose3d(input view, filter view) with asymmetric
// padding and the sub-dilation, written to the output view.
struct PhaseProblem {
  StridedView input;   // of the NDHWC input
  StridedView filter;  // of the [Cin, T, R, S, Cout] filter; extent = the sub-kernel's taps
  StridedView output;  // of the NDHWC activation
  Extent3 lower_padding{};
  Extent3 upper_padding{};
  Extent3 dilation{};

  int64_t output_spatial() const { return output.extent[0] * output.extent[1] * output.extent[2]; }

  bool operator==(const PhaseProblem&) const = default;
};

struct SubpixelPlan {
  std::vector<PhaseProblem> phases;  // every reached output pixel belongs to exactly one
  int64_t unreached_pixels = 0;      // per sample: output pixels no tap reaches (value ReLU(bias))
};

SubpixelPlan plan_subpixel(const Problem& problem);

// When every kernel extent equals its stride, with no padding, output padding or
// dilation, each input pixel alone produces a disjoint block of stride_d x stride_h x
// stride_w output pixels (one tap each). The whole deconvolution is then one GEMM,
// [input pixels, Cin] x [Cin, blocks * Cout], whose right operand is the packed filter
// [Cin, T, R, S, Cout] as it is, and whose output holds the activation in
// space-to-depth order (input pixel major, then block position, then channel): one
// launch instead of one per phase; the normalize pass reorders the pixels as it reads.
bool is_pixel_shuffle_gemm(const Problem& problem);

// The 1x1x1, unit-stride problem of that GEMM: out_channels = blocks * Cout and
// num_groups = blocks * num_groups (each block's channels keep their groups), output
// extent = input extent.
Problem pixel_shuffle_gemm_problem(const Problem& problem);

}  // namespace cutlassfuse
