// The extension module `cutlassfuse._C`. Importing it loads this library, whose static
// initialisers register the operators with torch.ops.cutlassfuse.
//
// In a CUDA build the module also holds, for each forward op, its CUDA kernel and its
// Autograd-key kernel as functions taking the op's arguments, for the modules' calls
// whose dispatch would reach those kernels and do nothing else (direct_calls.py): the
// CUDA kernel where nothing is recorded for a backward, the Autograd kernel where a
// tensor requires grad in grad mode: it records the call, and its forward is the op's
// CUDA kernel called directly too (the registered Autograd kernel redispatches below
// autograd). A call through torch.ops converts each of the op's arguments to the
// dispatcher's boxed values and back; for a layer whose kernels take a few
// microseconds, that conversion was a tenth of a whole network's host time. Errors and
// warnings reach Python as the op's do, and the GIL is released while the kernels are
// issued, as torch.ops does.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "torch/block_kernels.h"
#include "torch/op_kernels.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "cutlassfuse's compiled operators, registered as torch.ops.cutlassfuse.*";
#if CUTLASSFUSE_WITH_CUDA
  using namespace cutlassfuse;
  m.def("conv_transpose3d_relu_group_norm_cuda", torch::wrap_pybind_function_no_gil(&kernel<at::Tensor, &forward_cuda>),
        "torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm's CUDA kernel, called without the dispatcher");
  m.def("conv_transpose3d_relu_group_norm_autograd",
        torch::wrap_pybind_function_no_gil(&conv_transpose3d_relu_group_norm_autograd_cuda),
        "torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm's Autograd kernel, called without the dispatcher");
  m.def("conv3d_norm_activation_cuda",
        torch::wrap_pybind_function_no_gil(&block_kernel<at::Tensor, &block_forward_cuda>),
        "torch.ops.cutlassfuse.conv3d_norm_activation's CUDA kernel, called without the dispatcher");
  m.def("conv3d_norm_activation_autograd", torch::wrap_pybind_function_no_gil(&conv3d_norm_activation_autograd_cuda),
        "torch.ops.cutlassfuse.conv3d_norm_activation's Autograd kernel, called without the dispatcher");
  m.def("group_norm_activation_cuda",
        torch::wrap_pybind_function_no_gil(&norm_kernel<at::Tensor, &norm_activation_forward_cuda>),
        "torch.ops.cutlassfuse.group_norm_activation's CUDA kernel, called without the dispatcher");
  m.def("group_norm_activation_autograd", torch::wrap_pybind_function_no_gil(&group_norm_activation_autograd_cuda),
        "torch.ops.cutlassfuse.group_norm_activation's Autograd kernel, called without the dispatcher");
#endif
}
