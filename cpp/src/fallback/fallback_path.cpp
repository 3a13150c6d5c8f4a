// The CUDA fallback for calls the fused sm90 path does not take (other GPUs, float32,
// channel counts TMA cannot align, conv groups, ...): cuDNN's transposed convolution
// without bias, then this project's GroupNorm statistics, finalize and normalize
// kernels (group_norm_generic.h), adding the bias and applying ReLU before the norm on
// the fly. The normalize runs in place; a call that keeps what its backward reads
// writes the output beside the activation in the same pass, or, keeping the
// convolution's output (op.h, KeptTensor), beside that output, which it leaves as it is;
// the finalize writes mean and rstd. The activation in space-to-depth order (kept where
// the fused path was expected to run its pixel-shuffle GEMM) is a copy of the activation.
//
// float32 runs the convolution as PyTorch does (float32 mode "pytorch", settings.h):
// ATen's convolution, the call nn.ConvTranspose3d makes (its bias added after), reads
// PyTorch's switches (TF32, deterministic, benchmark). float16/bfloat16 ask cuDNN for
// deterministic algorithms, so two calls are bitwise equal.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDAGuard.h>

#include "fallback/fallback_path.h"

#include "cutlassfuse/common/nvtx.h"
#include "cutlassfuse/norm/group_norm_generic.h"
#include "dispatch/device_allocation.h"
#include "dispatch/op_arguments.h"
#include "norm/block_norm.h"

namespace cutlassfuse {
namespace {

// The convolution without its bias (the ReLU pass adds it).
at::Tensor convolution(const OpArgs& a) {
  return convolution_without_bias(a.input, a.weight, {a.stride, a.padding, a.output_padding, a.dilation, a.groups},
                                  /*transposed=*/true);
}

std::string unsupported_reason(const OpArgs& a, const Problem& p) {
  if (std::string why = cudnn_pipeline_unsupported_reason(a.input, p); !why.empty()) return why;
  if (!affine_element_type(a)) return "norm_weight/norm_bias are not both float32, float16 or bfloat16 of one dtype";
  return {};
}

class FallbackCall final : public PlannedCall {
 public:
  explicit FallbackCall(const Call& call) : call_(call) {}

  std::string description() const override {
    const char* conv = call_.args.input.scalar_type() == at::kFloat
                           ? "PyTorch's conv_transpose3d under its switches (float32 mode 'pytorch': TF32 where "
                             "torch.backends.cudnn allows it)"
                           : "cuDNN conv_transpose3d (deterministic)";
    return std::string(conv) + " + cutlassfuse ReLU/GroupNorm kernels" + kept_description();
  }

  ForwardOutputs run() const override;

 private:
  std::string kept_description() const {
    if (!call_.keep_for_backward) return "";
    switch (call_.kept) {
      case KeptTensor::kConvOutput:
        return " (keeping for the backward: the convolution's output without bias, the normalize pass writing the "
               "output beside it, and GroupNorm's mean and rstd)";
      case KeptTensor::kActivationSpaceToDepth:
        return " (keeping for the backward: the activation ReLU(conv + bias), written beside the output by the "
               "normalize pass and copied to space-to-depth order, and GroupNorm's mean and rstd)";
      case KeptTensor::kActivation: break;
    }
    return " (keeping for the backward: the activation ReLU(conv + bias), channels-last, written beside the output "
           "by the normalize pass, and GroupNorm's mean and rstd)";
  }

  Call call_;
};

ForwardOutputs FallbackCall::run() const {
  const OpArgs& a = call_.args;
  const Problem& p = call_.problem;
  const NvtxRange op_range("cutlassfuse.conv_transpose3d_relu_group_norm");
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const ElementType element = *element_type(a.input.scalar_type());

  at::Tensor y;
  {
    const NvtxRange range("cutlassfuse.cudnn_conv_transpose3d");
    y = convolution(a).contiguous(output_memory_format(a.input, a.weight));
  }
  const ActivationLayout layout = layout_of(y);

  std::optional<at::Tensor> bias, gamma, beta;
  const void* bias_ptr = data_or_null(a.bias, bias);
  const GroupNormShape shape = group_norm_shape(p);
  const int sm_count = at::cuda::getDeviceProperties(y.device().index())->multiProcessorCount;
  const auto options = a.input.options();
  const StatisticsWorkspace stats(generic_stats_tiles(shape, sm_count), shape, options);
  const GroupNormAffine affine{data_or_null(a.norm_weight, gamma), data_or_null(a.norm_bias, beta),
                               *affine_element_type(a)};
  SingleRegionFinalize finalize = statistics_finalize(stats.data(), stats.sources, element, shape, affine,
                                                      static_cast<float>(p.eps), stats.scale_shift);
  ForwardOutputs result;
  NormalizeOutputs outputs;
  if (call_.keep_for_backward) {
    result.out = empty_on_device(y.sizes(), options, output_memory_format(a.input, a.weight));
    const bool keep_conv_output = call_.kept == KeptTensor::kConvOutput;
    if (keep_conv_output) {
      result.kept = y;
    } else {
      // An NDHWC convolution output becomes the activation in place.
      result.kept = layout == ActivationLayout::kChannelsLast
                        ? y
                        : empty_on_device(y.sizes(), options, at::MemoryFormat::ChannelsLast3d);
    }
    result.mean = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
    result.rstd = empty_on_device({p.batch, p.num_groups}, options.dtype(at::kFloat));
    finalize.mean = result.mean.data_ptr<float>();
    finalize.rstd = result.rstd.data_ptr<float>();
    outputs = {result.out.data_ptr(), keep_conv_output ? nullptr : result.kept.data_ptr()};
  } else {
    result.out = y;
  }

  const NvtxRange range("cutlassfuse.relu_group_norm");
  const PreNorm pre{bias_ptr, {ActivationKind::kReLU}};
  norm_activation_stats(element, y.data_ptr(), layout, pre, shape, stats.sources.regions[0].tiles, stats.data(),
                        stream);
  group_norm_finalize(finalize, stream);
  norm_activation_normalize(element, y.data_ptr(), layout, pre, stats.scale_shift, ActivationParams{}, shape, outputs,
                            stream);
  if (call_.kept == KeptTensor::kActivationSpaceToDepth)
    result.kept = activation_to_space_to_depth(result.kept, a.stride);
  return result;
}

}  // namespace

at::Tensor convolution_without_bias(const at::Tensor& input, const at::Tensor& weight, const ConvTransposeGeometry& g,
                                    bool transposed) {
  if (input.scalar_type() == at::kFloat) {
    return at::convolution(input, weight, std::nullopt, g.stride, g.padding, g.dilation, transposed, g.output_padding,
                           g.groups);
  }
  const bool benchmark = at::globalContext().benchmarkCuDNN();
  if (transposed) {
    return at::cudnn_convolution_transpose(input, weight, g.padding, g.output_padding, g.stride, g.dilation, g.groups,
                                           benchmark, /*deterministic=*/true, /*allow_tf32=*/false);
  }
  return at::cudnn_convolution(input, weight, g.padding, g.stride, g.dilation, g.groups, benchmark,
                               /*deterministic=*/true, /*allow_tf32=*/false);
}

std::string generic_kernels_unsupported_reason(const at::Tensor& input, int64_t batch) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(input.device().index());
  if (props->major < 8)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) +
           ", cutlassfuse's kernels need sm_80 or newer";
  if (!element_type(input.scalar_type())) return "dtype is not float16, bfloat16 or float32";
  if (batch == 0) return "empty batch";
  if (batch > 65535) return "batch larger than 65535 (grid y limit of the finalize kernel)";
  return {};
}

std::string cudnn_pipeline_unsupported_reason(const at::Tensor& input, const Problem& p) {
  if (std::string why = generic_kernels_unsupported_reason(input, p.batch); !why.empty()) return why;
  if (!at::detail::getCUDAHooks().compiledWithCuDNN() || !at::globalContext().userEnabledCuDNN())
    return "cuDNN is unavailable or disabled";
  // Legal when dilation > stride, but cuDNN rejects it (PyTorch's CUDA path avoids cuDNN there too).
  for (int i = 0; i < 3; ++i)
    if (p.output_padding[i] >= p.stride[i]) return "output_padding >= stride in some dimension (cuDNN rejects it)";
  // PyTorch's cuDNN convolution splits the batch to keep each call under 2^31
  // elements; one sample past that it cannot take.
  constexpr int64_t kMax32 = (int64_t{1} << 31) - 1;
  if (p.input_numel() / p.batch > kMax32 || p.output_numel() / p.batch > kMax32)
    return "one sample has more than 2^31 elements (cuDNN's limit)";
  return {};
}

Routing plan_fallback_call(const Call& call) {
  if (std::string why = unsupported_reason(call.args, call.problem); !why.empty()) return why;
  return std::make_unique<FallbackCall>(call);
}

}  // namespace cutlassfuse
