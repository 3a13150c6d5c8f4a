// The sub-pixel phase plan (see cutlassfuse/plan/subpixel.h for the derivation).
#include "cutlassfuse/plan/subpixel.h"

#include <algorithm>
#include <numeric>

namespace cutlassfuse {
namespace {

// Floor division for a possibly negative numerator and a positive divisor.
int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); }

// Packed strides of the (outer, d, h, w) modes of a channels-last tensor.
std::array<int64_t, 4> packed_strides(const Extent3& spatial, int64_t channels) {
  const int64_t w = channels;
  const int64_t h = spatial[2] * w;
  const int64_t d = spatial[1] * h;
  return {spatial[0] * d, d, h, w};
}

}  // namespace

std::vector<PhaseExtent> plan_dimension(int64_t input, int64_t kernel, int64_t stride, int64_t padding,
                                        int64_t output_padding, int64_t dilation) {
  const int64_t output = transposed_conv_output_extent(input, kernel, stride, padding, output_padding, dilation);
  const int64_t g = std::gcd(dilation, stride);
  std::vector<PhaseExtent> phases;
  for (int64_t phi = 0; phi < stride; ++phi) {
    int64_t tap_begin = 0;
    while (tap_begin < kernel && (tap_begin * dilation) % stride != phi) ++tap_begin;
    if (tap_begin == kernel) continue;  // no tap reaches this phase: bias only
    const int64_t tap_step = stride / g;
    const int64_t tap_count = (kernel - 1 - tap_begin) / tap_step + 1;
    const int64_t sub_dilation = dilation / g;
    const int64_t reach = sub_dilation * (tap_count - 1);  // input positions a phase output spans

    // The phase's outputs o = stride * q + phi - padding >= 0, from q_first on.
    const int64_t q_first = -floor_div(phi - padding, stride);
    const int64_t first_output = stride * q_first + phi - padding;
    const int64_t count = first_output < output ? (output - 1 - first_output) / stride + 1 : 0;
    // Output k reads x[k + lower - sub_dilation * j]; its first tap sits `shift` inputs back.
    const int64_t shift = (tap_begin * dilation - phi) / stride;
    const int64_t lower = q_first - shift;

    // Outputs whose reads all fall outside the input hold the bias only: trim them.
    const int64_t k_begin = std::max<int64_t>(0, -lower);
    const int64_t k_end = std::min(count, input - lower + reach);
    if (k_begin >= k_end) continue;
    const int64_t input_begin = std::max<int64_t>(0, lower + k_begin - reach);
    const int64_t input_end = std::min(input, lower + k_end);
    const int64_t trimmed_lower = lower + k_begin - input_begin;
    const int64_t trimmed_count = k_end - k_begin;
    const int64_t input_count = input_end - input_begin;
    phases.push_back({first_output + stride * k_begin, trimmed_count, tap_begin, tap_step, tap_count, sub_dilation,
                      input_begin, input_count, trimmed_lower, input_count - trimmed_count - trimmed_lower + reach});
  }
  return phases;
}

SubpixelPlan plan_subpixel(const Problem& p) {
  std::array<std::vector<PhaseExtent>, 3> dims;
  int64_t reached_pixels = 1;
  for (int i = 0; i < 3; ++i) {
    dims[i] = plan_dimension(p.input_size[i], p.kernel_size[i], p.stride[i], p.padding[i], p.output_padding[i],
                             p.dilation[i]);
    int64_t reached = 0;
    for (const PhaseExtent& e : dims[i]) reached += e.count;
    reached_pixels *= reached;
  }

  const auto input_strides = packed_strides(p.input_size, p.in_channels);
  const auto filter_strides = packed_strides(p.kernel_size, p.out_channels / p.conv_groups);
  const auto output_strides = packed_strides(p.output_size, p.out_channels);
  SubpixelPlan plan;
  plan.unreached_pixels = p.output_spatial() - reached_pixels;
  for (const PhaseExtent& d : dims[0]) {
    for (const PhaseExtent& h : dims[1]) {
      for (const PhaseExtent& w : dims[2]) {
        const std::array<const PhaseExtent*, 3> e{&d, &h, &w};
        PhaseProblem phase;
        phase.input.stride = input_strides;
        phase.filter.stride[0] = filter_strides[0];
        phase.output.stride[0] = output_strides[0];
        for (int i = 0; i < 3; ++i) {
          phase.input.offset += e[i]->input_begin * input_strides[i + 1];
          phase.input.extent[i] = e[i]->input_count;
          phase.filter.offset += e[i]->tap_begin * filter_strides[i + 1];
          phase.filter.extent[i] = e[i]->tap_count;
          phase.filter.stride[i + 1] = e[i]->tap_step * filter_strides[i + 1];
          phase.output.offset += e[i]->first_output * output_strides[i + 1];
          phase.output.extent[i] = e[i]->count;
          phase.output.stride[i + 1] = p.stride[i] * output_strides[i + 1];
          phase.lower_padding[i] = e[i]->lower_padding;
          phase.upper_padding[i] = e[i]->upper_padding;
          phase.dilation[i] = e[i]->dilation;
        }
        plan.phases.push_back(phase);
      }
    }
  }
  return plan;
}

bool is_pixel_shuffle_gemm(const Problem& p) {
  for (int i = 0; i < 3; ++i) {
    if (p.kernel_size[i] != p.stride[i] || p.padding[i] != 0 || p.output_padding[i] != 0 || p.dilation[i] != 1)
      return false;
  }
  return p.stride[0] * p.stride[1] * p.stride[2] > 1 && p.conv_groups == 1;
}

Problem pixel_shuffle_gemm_problem(const Problem& p) {
  const int64_t blocks = p.stride[0] * p.stride[1] * p.stride[2];
  Problem gemm = p;
  gemm.out_channels = blocks * p.out_channels;
  gemm.num_groups = blocks * p.num_groups;
  gemm.kernel_size = {1, 1, 1};
  gemm.stride = {1, 1, 1};
  gemm.output_size = p.input_size;
  return gemm;
}

}  // namespace cutlassfuse
