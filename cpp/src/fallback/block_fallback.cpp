// The block family on CUDA (block.h): the convolution through cuDNN without its bias
// (float32 as PyTorch runs it), then this project's statistics, finalize and normalize
// kernels (group_norm_generic.h), which add the bias and apply the activation on the
// fly: statistics of act(y + bias) (activation before the norm) or of y + bias (after
// it), and out = act(x * scale + shift) for an activation after the norm. The
// standalone norm runs the same kernels on its input.
//
// A tensor that the GPU holds on chip (shared memory, and for 16-bit tensors L2 past it)
// takes one launch instead of the three (group_norm_resident.h) when it is written in its
// own layout.
//
// The normalize runs in place on the convolution's output when nothing is kept for a
// backward. A call that keeps what its backward reads writes the output beside the
// convolution's output, which it keeps as it is (no copy), and the finalize writes mean
// and rstd. Calls the kernels do not take run the reference (ATen's kernels).
//
// A float16/bfloat16 Conv3d whose input channels are not a multiple of 8 convolves
// copies of the input and the weight with zero channels appended (see
// pads_input_channels).
//
// A float16/bfloat16 block with NCDHW input and output convolves channels-last operands:
// the input through this project's transpose and the weight channels-last (a module's
// packed copy, else a copy made per call), so that cuDNN writes its output
// NDHWC without the transpose it adds for an NCDHW output, and the normalize writes the
// output NCDHW through its on-chip transpose, in the pass it makes anyway. A call keeping
// for its backward keeps that channels-last output (kept_conv_output_memory_format).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "cutlassfuse/block.h"
#include "cutlassfuse/common/layout.h"
#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "cutlassfuse/op.h"
#include "dispatch/block_path.h"
#include "dispatch/device_allocation.h"
#include "dispatch/op_arguments.h"
#include "fallback/fallback_path.h"
#include "norm/block_norm.h"

namespace cutlassfuse {
namespace {

std::string activation_unsupported_reason(const ActivationArgs& a) {
  if (a.weight.has_value() && a.weight->defined() && !element_type(a.weight->scalar_type()))
    return "activation_weight is not float32, float16 or bfloat16";
  return {};
}

std::string norm_unsupported_reason(const std::optional<at::Tensor>& gamma, const std::optional<at::Tensor>& beta,
                                    const ActivationArgs& activation) {
  if (!affine_element_type(gamma, beta))
    return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  return activation_unsupported_reason(activation);
}

std::string block_unsupported_reason(const ConvNormActivationArgs& a, const BlockProblem& b) {
  if (std::string why = cudnn_pipeline_unsupported_reason(a.input, b.conv); !why.empty()) return why;
  return norm_unsupported_reason(a.norm_weight, a.norm_bias, a.activation);
}

std::string standalone_unsupported_reason(const NormActivationArgs& a, const BlockProblem& b) {
  if (std::string why = generic_kernels_unsupported_reason(a.input, b.conv.batch); !why.empty()) return why;
  return norm_unsupported_reason(a.norm_weight, a.norm_bias, a.activation);
}

// Statistics, finalize and normalize of `y` (packed NCDHW or NDHWC): into `out` when
// given (y's layout, or NCDHW), else in place; mean and rstd when `keep`. In one launch
// where the resident kernel takes the call (resident_norm), else in three.
NormResult normalize(const at::Tensor& y, const std::optional<at::Tensor>& out, const NormEpilogue& norm,
                     const Problem& p, bool keep, KernelOperands& operands) {
  const NvtxRange range("cutlassfuse.norm_activation");
  if (std::optional<NormResult> resident = resident_norm(y, out, norm, p, keep, operands)) return std::move(*resident);
  const GroupNormShape shape = group_norm_shape(p);
  const TilePartials tiles =
      generic_stats_tiles(shape, at::cuda::getDeviceProperties(y.device().index())->multiProcessorCount);
  const StatisticsWorkspace stats(tiles, shape, y.options());
  norm_activation_stats(*element_type(y.scalar_type()), y.data_ptr(), layout_of(y), norm.pre, shape, tiles,
                        stats.data(), at::cuda::getCurrentCUDAStream());
  return finish_norm(y, out, stats, norm, p, keep, operands);
}

// Whether the call convolves channels-last operands for an NCDHW output (see above).
bool convolves_channels_last(const ConvNormActivationArgs& a) {
  const at::ScalarType type = a.input.scalar_type();
  return (type == at::kHalf || type == at::kBFloat16) && a.input.is_contiguous() &&
         block_output_memory_format(a) == at::MemoryFormat::Contiguous;
}

// The layout of the convolution's output, which the normalize reads.
at::MemoryFormat conv_output_memory_format(const ConvNormActivationArgs& a, bool keep) {
  return keep                         ? kept_conv_output_memory_format(a)
         : convolves_channels_last(a) ? at::MemoryFormat::ChannelsLast3d
                                      : block_output_memory_format(a);
}

// Whether the block's norm runs in one resident launch (normalize): the output in the
// convolution output's layout, on a tensor the kernel takes.
bool normalizes_in_one_launch(const BlockCall& call) {
  const ConvNormActivationArgs& a = call.args;
  const at::MemoryFormat format = block_output_memory_format(a);
  if (conv_output_memory_format(a, call.keep_for_backward) != format) return false;
  const void* residual = has_residual(a) && a.residual->is_contiguous(format) ? a.residual->const_data_ptr() : nullptr;
  return resident_norm_takes(a.input.scalar_type(), format, nullptr, residual, call.problem.conv);
}

constexpr const char* kNormKernels = "cutlassfuse activation/GroupNorm statistics, finalize and normalize kernels";
constexpr const char* kResidentNormKernel =
    "one cutlassfuse activation/GroupNorm kernel holding the tensor on chip (statistics, grid barrier, normalize)";

// cuDNN runs a float16/bfloat16 Conv3d whose input channels are not a multiple of 8
// without tensor cores (implicit_convolveNd_sgemm: 0.55 ms for MONAI UNet's first layer,
// one channel of 2x96^3, stride 2). Zero channels appended to the input and the weight
// (channels-last copies) make it a tensor-core convolution with the same sums: the
// products the padding adds are exact zeros.
bool pads_input_channels(const ConvNormActivationArgs& a) {
  const at::ScalarType type = a.input.scalar_type();
  return !a.transposed && a.groups == 1 && (type == at::kHalf || type == at::kBFloat16) && a.input.size(1) % 8 != 0;
}

// `t` ([*, C, D, H, W], 16 bits) with zero channels after its C, up to `channels` (a
// multiple of 8), channels-last: one pass of pad_channels_ndhwc for a packed NCDHW or
// channels-last `t` (an allocation and a launch, where ATen's fill, view and copy took
// three operations and two passes over the padded tensor), ATen's otherwise.
at::Tensor with_zero_channels(const at::Tensor& t, int64_t channels) {
  std::vector<int64_t> sizes = t.sizes().vec();
  sizes[1] = channels;
  const at::TensorOptions options = t.options().memory_format(at::MemoryFormat::ChannelsLast3d);
  const bool ncdhw = t.is_contiguous();
  if (t.numel() > 0 && (ncdhw || t.is_contiguous(at::MemoryFormat::ChannelsLast3d))) {
    at::Tensor padded = at::empty(sizes, options);
    pad_channels_ndhwc(*element_type(t.scalar_type()), t.const_data_ptr(), /*channels_last_source=*/!ncdhw,
                       padded.data_ptr(), t.size(0), t.size(1), channels, t.numel() / (t.size(0) * t.size(1)),
                       at::cuda::getCurrentCUDAStream());
    return padded;
  }
  at::Tensor padded = at::zeros(sizes, options);
  padded.narrow(1, 0, t.size(1)).copy_(t);
  return padded;
}

class FallbackBlock final : public PlannedBlock {
 public:
  explicit FallbackBlock(const BlockCall& call) : call_(call) {}

  std::string description() const override {
    return std::string(kConvolution) + " + " + (normalizes_in_one_launch(call_) ? kResidentNormKernel : kNormKernels) +
           (convolves_channels_last(call_.args) ? kChannelsLastConvolution : "") +
           (pads_input_channels(call_.args) ? kPaddedChannels : "");
  }

  BlockForBackward run() const override {
    const ConvNormActivationArgs& a = call_.args;
    const BlockProblem& b = call_.problem;
    const bool keep = call_.keep_for_backward;
    const NvtxRange op_range("cutlassfuse.conv3d_norm_activation");
    const c10::cuda::CUDAGuard device_guard(a.input.device());
    const bool channels_last = convolves_channels_last(a);
    at::Tensor y;
    {
      const NvtxRange range("cutlassfuse.cudnn_convolution");
      at::Tensor input = a.input;
      at::Tensor weight = a.weight;
      if (pads_input_channels(a)) {
        const int64_t channels = ceil_div(a.input.size(1), 8) * 8;
        input = with_zero_channels(a.input, channels);
        weight = with_zero_channels(a.weight, channels);
      } else {
        if (channels_last) input = convert_memory_format_cuda(a.input, /*channels_last=*/true);
        // cuDNN reads the weight in a channels-last input's layout: the packed copy, when
        // given, spares ATen's conversion of the weight.
        if (input.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d) weight = channels_last_weight(a);
      }
      y = convolution_without_bias(input, weight, {a.stride, a.padding, a.output_padding, a.dilation, a.groups},
                                   a.transposed)
              .contiguous(conv_output_memory_format(a, keep));
    }
    KernelOperands operands;
    const ActivationParams act =
        kernel_activation(b.activation, a.activation.parameter, a.activation.weight, operands.slopes);
    const bool before = b.position == ActivationPosition::kBeforeNorm;
    const NormEpilogue norm{a.norm_weight, a.norm_bias,
                            PreNorm{data_or_null(a.bias, operands.bias), before ? act : ActivationParams{}},
                            before ? ActivationParams{} : act, residual_in(a, block_output_memory_format(a))};
    // Written beside y when y is kept, or NCDHW from channels-last y; else in place.
    std::optional<at::Tensor> out;
    if (keep || block_output_memory_format(a) != y.suggest_memory_format())
      out = empty_on_device(y.sizes(), y.options(), block_output_memory_format(a));
    NormResult r = normalize(y, out, norm, b.conv, keep, operands);
    return {std::move(r.out), keep ? y : at::Tensor(), std::move(r.mean), std::move(r.rstd)};
  }

 private:
  static constexpr const char* kConvolution =
      "cuDNN convolution without bias (float32: PyTorch's, under its switches; float16/bfloat16: deterministic)";
  static constexpr const char* kPaddedChannels =
      "; the input channels zero-padded to a multiple of 8 (cuDNN's tensor-core kernels)";
  static constexpr const char* kChannelsLastConvolution =
      "; the convolution on channels-last operands (the input through cutlassfuse's "
      "transpose) and the output written NCDHW by the normalize";
  BlockCall call_;
};

NormForBackward run_standalone(const NormActivationArgs& a, const BlockProblem& b, bool keep) {
  const NvtxRange op_range("cutlassfuse.group_norm_activation");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const at::Tensor x = a.input.contiguous(a.input.suggest_memory_format());
  KernelOperands operands;
  const ActivationParams act =
      kernel_activation(b.activation, a.activation.parameter, a.activation.weight, operands.slopes);
  const at::Tensor out = empty_on_device(x.sizes(), x.options(), x.suggest_memory_format());
  const NormEpilogue norm{a.norm_weight, a.norm_bias, {}, act};
  NormResult r = normalize(x, out, norm, b.conv, keep, operands);
  return {std::move(r.out), std::move(r.mean), std::move(r.rstd)};
}
}  // namespace

BlockRouting plan_fallback_block(const BlockCall& call) {
  if (std::string why = block_unsupported_reason(call.args, call.problem); !why.empty()) return why;
  return std::make_unique<FallbackBlock>(call);
}

at::Tensor norm_activation_forward_cuda(const NormActivationArgs& a) {
  const BlockProblem b = validate_norm_activation(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (!standalone_unsupported_reason(a, b).empty()) return reference_norm_activation_forward(a);
  return std::get<0>(run_standalone(a, b, /*keep=*/false));
}

NormForBackward norm_activation_forward_for_backward_cuda(const NormActivationArgs& a) {
  const BlockProblem b = validate_norm_activation(a);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  if (!standalone_unsupported_reason(a, b).empty()) return reference_norm_activation_forward_for_backward(a);
  return run_standalone(a, b, /*keep=*/true);
}

std::string explain_norm_activation_cuda(const NormActivationArgs& a) {
  const BlockProblem b = validate_norm_activation(a);
  const std::string why = standalone_unsupported_reason(a, b);
  if (!why.empty()) return std::string(kNormReferenceDescription) + ", because " + why;
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const at::MemoryFormat format = a.input.suggest_memory_format();
  const bool resident =
      resident_norm_takes(a.input.scalar_type(), format,
                          a.input.is_contiguous(format) ? a.input.const_data_ptr() : nullptr, nullptr, b.conv);
  return std::string("norm: ") + (resident ? kResidentNormKernel : kNormKernels);
}

}  // namespace cutlassfuse
