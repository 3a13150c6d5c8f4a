// A call's outputs and temporaries, allocated from the CUDA caching allocator directly.
//
// at::empty dispatches to ATen's CUDA kernel, which takes two device guards (each a
// cudaGetDevice and maybe a cudaSetDevice) before it reaches the allocator: about half
// of an allocation's host time, and a call keeping what its backward reads allocates
// five tensors, on layers whose calls are bound by the host. The kernel paths allocate
// inside their own device guard, on the input's device, so neither guard has anything
// to do. Every element of these tensors is written by the call's kernels before it is
// read, so at::empty's fill of uninitialized memory under
// torch.use_deterministic_algorithms has nothing to do either.
#pragma once

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAFunctions.h>

namespace cutlassfuse {

// An uninitialized CUDA tensor on the current device, which must be `options`'s device
// (the caller holds a device guard for it).
inline at::Tensor empty_on_device(at::IntArrayRef sizes, const at::TensorOptions& options,
                                  at::MemoryFormat format = at::MemoryFormat::Contiguous) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(options.device().is_cuda() &&
                                   options.device().index() == c10::cuda::current_device());
  constexpr c10::DispatchKeySet cuda_keys(c10::DispatchKey::CUDA);
  return at::Tensor(at::detail::empty_generic(sizes, at::cuda::getCUDADeviceAllocator(), cuda_keys,
                                              options.dtype().toScalarType(), format));
}

}  // namespace cutlassfuse
