#include "sm90/fused_block.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/norm/group_norm.h"
#include "cutlassfuse/op.h"
#include "cutlassfuse/plan/math_mode.h"
#include "cutlassfuse/sm90/fprop.h"
#include "dispatch/device_allocation.h"
#include "dispatch/op_arguments.h"
#include "norm/block_norm.h"
#include "sm90/tma_alignment.h"

namespace cutlassfuse::sm90 {
namespace {

// The operands as the kernel reads them: NDHWC input (through cutlassfuse's transpose
// from NCDHW), the weight in channels-last order (channels_last_weight: the packed copy,
// or ATen's copy, a no-op for a weight already channels-last).
at::Tensor channels_last_input(const at::Tensor& input) {
  return input.is_contiguous(at::MemoryFormat::ChannelsLast3d)
             ? input
             : convert_memory_format_cuda(input, /*channels_last=*/true);
}

class FusedBlock final : public PlannedBlock {
 public:
  FusedBlock(const BlockCall& call, MathMode math) : call_(call), math_(math) {}

  std::string description() const override {
    const bool before = call_.problem.position == ActivationPosition::kBeforeNorm;
    return std::string("CUTLASS sm90 implicit-GEMM Conv3d (") + std::to_string(kFpropTile.m) + "x" +
           std::to_string(kFpropTile.n) + "x" + std::to_string(kFpropTileK) + " ping-pong) with the bias" +
           (before ? ", the activation" : "") +
           " and GroupNorm statistics in its epilogue + cutlassfuse finalize and normalize kernels" +
           (call_.args.input.is_contiguous(at::MemoryFormat::ChannelsLast3d)
                ? ""
                : "; the NCDHW input through cutlassfuse's transpose") +
           (block_output_memory_format(call_.args) == at::MemoryFormat::Contiguous
                ? "; the output written NCDHW by the normalize"
                : "") +
           (call_.keep_for_backward ? kKeeping : "");
  }

  BlockForBackward run() const override {
    const ConvNormActivationArgs& a = call_.args;
    const BlockProblem& b = call_.problem;
    const Problem& p = b.conv;
    const bool keep = call_.keep_for_backward;
    const NvtxRange op_range("cutlassfuse.conv3d_norm_activation");
    const c10::cuda::CUDAGuard device_guard(a.input.device());
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    const at::Tensor input = channels_last_input(a.input);
    const at::Tensor filter = channels_last_weight(a);
    const at::Tensor y =
        empty_on_device({p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]},
                        input.options(), at::MemoryFormat::ChannelsLast3d);
    const GroupNormShape shape = group_norm_shape(p);
    StatisticsWorkspace stats(TilePartials::for_tiles(shape, kFpropTile.m, kFpropTile.n), shape, y.options());

    KernelOperands operands;
    const ActivationParams act =
        kernel_activation(b.activation, a.activation.parameter, a.activation.weight, operands.slopes);
    const bool before = b.position == ActivationPosition::kBeforeNorm;
    // PReLU before the norm: the epilogue reads one float32 slope per output channel.
    std::optional<at::Tensor> slopes;
    if (before && b.activation == ActivationKind::kPReLU) {
      slopes = a.activation.weight->to(at::kFloat).expand({p.out_channels}).contiguous();
    }
    // The epilogue reads the bias in 16-byte vectors: a view at another offset is copied.
    std::optional<at::Tensor> bias;
    if (present(a.bias)) {
      bias = a.bias->contiguous();
      if (!aligned_for_tma(*bias)) bias = bias->clone();
    }
    // A call keeping the convolution's output for its backward keeps it without the
    // bias: the epilogue stores and sums the bare output, the finalize adds the bias to
    // each (one-channel) group's mean, and the normalize adds it before normalizing.
    const void* stored_bias = bias && !keep ? bias->const_data_ptr() : nullptr;
    const void* deferred_bias = bias && keep ? bias->const_data_ptr() : nullptr;
    stats.mean_shift = deferred_bias;
    const FpropOperands ops{input.const_data_ptr(),
                            filter.const_data_ptr(),
                            stored_bias,
                            slopes ? slopes->const_data_ptr<float>() : nullptr,
                            y.data_ptr(),
                            stats.data()};
    const ActivationConstant epilogue_activation =
        before ? ActivationConstant{act.kind, act.parameter} : ActivationConstant{};
    const int sm_count = at::cuda::getDeviceProperties(a.input.device().index())->multiProcessorCount;
    {
      const NvtxRange range("cutlassfuse.fused_convolution");
      with_math(math_, [&](auto m) {
        if constexpr (is_16_bit(decltype(m)::value)) {
          fprop_fused<decltype(m)::value>(p, ops, epilogue_activation, sm_count, stream);
        }
      });
    }
    // Beside y when y is kept; NCDHW from the normalize's transpose; else in place.
    std::optional<at::Tensor> out;
    if (keep || block_output_memory_format(a) == at::MemoryFormat::Contiguous)
      out = empty_on_device(y.sizes(), y.options(), block_output_memory_format(a));
    const NormEpilogue norm{a.norm_weight, a.norm_bias, PreNorm{deferred_bias, {}}, before ? ActivationParams{} : act,
                            residual_in(a, block_output_memory_format(a))};
    NormResult r = finish_norm(y, out, stats, norm, p, keep, operands);
    return {std::move(r.out), keep ? y : at::Tensor(), std::move(r.mean), std::move(r.rstd)};
  }

 private:
  static constexpr const char* kKeeping =
      "; keeping for its backward the convolution's output without its bias (the finalize adds the bias to the "
      "mean, the normalize to each value) and the norm's mean and rstd, the output written beside it";

  BlockCall call_;
  MathMode math_;
};

std::string tensor_unsupported_reason(const ConvNormActivationArgs& a) {
  const at::ScalarType type = a.input.scalar_type();
  if (type != at::kHalf && type != at::kBFloat16) return "dtype is not float16 or bfloat16";
  if (a.weight.scalar_type() != type || (present(a.bias) && a.bias->scalar_type() != type))
    return "weight or bias of another dtype than the input";
  if (!affine_element_type(a.norm_weight, a.norm_bias))
    return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  if (present(a.activation.weight) && !element_type(a.activation.weight->scalar_type()))
    return "activation_weight is not float32, float16 or bfloat16";
  // TMA reads the input and the filter at their own addresses when they are already
  // channels-last (no copy is made); a misaligned address would make a faulting descriptor.
  if (a.input.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !aligned_for_tma(a.input))
    return "input data not 16-byte aligned (a view at an offset; TMA needs aligned addresses)";
  const at::Tensor& filter = present(a.packed_weight) ? *a.packed_weight : a.weight;
  if (filter.is_contiguous(at::MemoryFormat::ChannelsLast3d) && !aligned_for_tma(filter))
    return "weight data not 16-byte aligned (a view at an offset; TMA needs aligned addresses)";
  return {};
}

// The layers the fused kernel takes: those whose channels fill its tile, where it
// measured faster than cuDNN's convolution followed by the statistics pass. Elsewhere
// (16-channel layers, 64 channels and more) cuDNN's mainloop is faster by more than the
// statistics pass costs (docs/performance.md).
std::string channels_rule_violation(const Problem& p) {
  if (p.out_channels != kFpropTile.n || p.in_channels % kFpropTileK != 0) {
    return "the fused convolution takes " + std::to_string(kFpropTile.n) + " output channels and input channels in " +
           "multiples of " + std::to_string(kFpropTileK) +
           " (its tile; cuDNN + the statistics pass is faster elsewhere)";
  }
  return {};
}

// A call keeping tensors for its backward keeps the convolution's output without its
// bias, channels-last: what the epilogue stores when it adds neither the bias nor an
// activation.
std::string keeping_unsupported_reason(const ConvNormActivationArgs& a, const BlockProblem& b) {
  if (b.position == ActivationPosition::kBeforeNorm && b.activation != ActivationKind::kIdentity)
    return "a call keeping tensors for its backward with the activation before the norm (it keeps the convolution's "
           "output, which the epilogue activates)";
  if (present(a.bias) && b.conv.num_groups != b.conv.out_channels)
    return "a call keeping tensors for its backward with a bias and GroupNorm groups of several channels (it keeps "
           "the output without the bias, whose statistics the epilogue sums; the bias moves only a one-channel "
           "group's mean)";
  return {};
}

}  // namespace

BlockRouting plan_fused_block(const BlockCall& call) {
  const ConvNormActivationArgs& a = call.args;
  const Problem& p = call.problem.conv;
  if (!call.options.backend.fused_path) return "the fused path is turned off (cutlassfuse.backends fused_path=False)";
  if (call.problem.transposed) return "a ConvTranspose3d block (the fused kernel is a forward convolution)";
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(a.input.device().index());
  if (props->major != 9 || props->minor != 0)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) + ", the fused kernels need sm_90";
  if (std::string why = tensor_unsupported_reason(a); !why.empty()) return why;
  if (p.batch == 0 || p.output_spatial() == 0) return "empty output";
  if (const char* why = group_norm_unsupported_reason(group_norm_shape(p)); *why != '\0') return why;
  if (std::string why = channels_rule_violation(p); !why.empty()) return why;
  const MathMode math = a.input.scalar_type() == at::kHalf ? MathMode::kFloat16 : MathMode::kBFloat16;
  const std::string why = with_math(math, [&](auto m) -> std::string {
    if constexpr (is_16_bit(decltype(m)::value)) return fprop_unsupported_reason<decltype(m)::value>(p);
    return "float32";
  });
  if (!why.empty()) return why;
  if (call.keep_for_backward) {
    if (std::string why_not = keeping_unsupported_reason(a, call.problem); !why_not.empty()) return why_not;
  }
  return std::make_unique<FusedBlock>(call, math);
}

}  // namespace cutlassfuse::sm90
