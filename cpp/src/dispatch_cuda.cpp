// The CUDA kernel of the op: the fused sm90 path (CUTLASS dgrad with bias + ReLU in
// its epilogue, then GroupNorm statistics and normalization) when the call fits it,
// ATen's kernels otherwise.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "cutlassfuse/dgrad_sm90.h"
#include "cutlassfuse/group_norm.h"
#include "cutlassfuse/op.h"

namespace cutlassfuse {
namespace {

std::optional<ElementType> element_type(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return ElementType::kFloat16;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kFloat: return ElementType::kFloat32;
    default: return std::nullopt;
  }
}

bool present(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

GroupNormShape group_norm_shape(const Problem& p) {
  return {p.batch, p.out_channels, p.output_spatial(), p.num_groups};
}

// gamma and beta are read by one kernel argument type: both absent, or sharing a dtype.
std::optional<ElementType> affine_element_type(const OpArgs& a) {
  const at::Tensor* any = present(a.norm_weight) ? &*a.norm_weight : present(a.norm_bias) ? &*a.norm_bias : nullptr;
  if (any == nullptr) return ElementType::kFloat32;
  for (const auto* t : {&a.norm_weight, &a.norm_bias}) {
    if (present(*t) && (*t)->scalar_type() != any->scalar_type()) return std::nullopt;
  }
  return element_type(any->scalar_type());
}

const void* data_or_null(const std::optional<at::Tensor>& t, std::optional<at::Tensor>& keep_alive) {
  if (!present(t)) return nullptr;
  keep_alive = t->contiguous();
  return keep_alive->data_ptr();
}

}  // namespace

std::string fused_path_unsupported_reason(const OpArgs& a, const Problem& p) {
#if !CUTLASSFUSE_WITH_SM90A
  return "the library was built without sm_90a kernels";
#else
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(a.input.device().index());
  if (props->major != 9 || props->minor != 0)
    return "GPU is sm_" + std::to_string(props->major * 10 + props->minor) + ", the fused kernels need sm_90";
  const auto element = element_type(a.input.scalar_type());
  if (!element || *element == ElementType::kFloat32) return "dtype is not float16 or bfloat16";
  if (!affine_element_type(a)) return "norm_weight and norm_bias have different dtypes";
  if (p.batch == 0) return "empty batch";
  if (const char* why = group_norm_unsupported_reason(group_norm_shape(p)); *why != '\0') return why;
  return sm90::dgrad_bias_relu_unsupported_reason(*element, p);
#endif
}

at::Tensor fused_forward_cuda(const OpArgs& a, const Problem& p) {
  const c10::cuda::CUDAGuard device_guard(a.input.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const int sm_count = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const ElementType element = *element_type(a.input.scalar_type());
  const auto options = a.input.options();

  // TMA reads the input NDHWC and the filter as [Cin, T, R, S, Cout].
  const at::Tensor input = a.input.contiguous(at::MemoryFormat::ChannelsLast3d);
  const at::Tensor filter = a.weight.permute({0, 2, 3, 4, 1}).contiguous();
  std::optional<at::Tensor> bias, gamma, beta;
  at::Tensor activation = at::empty({p.batch, p.out_channels, p.output_size[0], p.output_size[1], p.output_size[2]},
                                    options.memory_format(at::MemoryFormat::ChannelsLast3d));
  sm90::dgrad_bias_relu(element, p,
                        {input.data_ptr(), filter.data_ptr(), data_or_null(a.bias, bias), activation.data_ptr()},
                        sm_count, stream);

  const GroupNormShape shape = group_norm_shape(p);
  const int64_t num_chunks = group_norm_num_chunks(shape, sm_count);
  static_assert(sizeof(WelfordPartial) == 3 * sizeof(float));
  at::Tensor partials = at::empty({p.batch, num_chunks, p.num_groups, 3}, options.dtype(at::kFloat));
  auto* partials_ptr = reinterpret_cast<WelfordPartial*>(partials.data_ptr<float>());
  group_norm_partial_stats(element, activation.data_ptr(), shape, num_chunks, partials_ptr, stream);

  // Channels-last output is normalized in place: each element is read and written by
  // the same thread, after the statistics pass has finished reading it.
  const bool channels_last = output_memory_format(a.input, a.weight) == at::MemoryFormat::ChannelsLast3d;
  at::Tensor out = channels_last ? activation : at::empty_like(activation, at::MemoryFormat::Contiguous);
  const GroupNormAffine affine{data_or_null(a.norm_weight, gamma), data_or_null(a.norm_bias, beta),
                               *affine_element_type(a)};
  group_norm_apply(element, activation.data_ptr(), partials_ptr, num_chunks, shape, affine,
                   static_cast<float>(p.eps), channels_last, out.data_ptr(), stream);
  return out;
}

}  // namespace cutlassfuse
