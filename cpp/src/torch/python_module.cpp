// The extension module `cutlassfuse._C`. Importing it loads this library, whose static
// initialisers register the operators with torch.ops.cutlassfuse.
//
// In a CUDA build the module also holds the block family's CUDA kernels as functions
// (conv3d_norm_activation_cuda, group_norm_activation_cuda: the ops' CUDA kernels, with
// the ops' arguments), for the block modules' calls whose dispatch would reach those
// kernels and do nothing else (direct_calls.py, `dispatcher_adds_nothing`). A call
// through torch.ops converts each of the op's arguments to the dispatcher's boxed values
// and back; for a layer whose kernels take a few microseconds, that conversion was a
// tenth of a whole network's host time. Errors and warnings reach Python as the
// op's do, and the GIL is released while the kernels are issued, as torch.ops does.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include "torch/block_kernels.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "cutlassfuse's compiled operators, registered as torch.ops.cutlassfuse.*";
#if CUTLASSFUSE_WITH_CUDA
  using namespace cutlassfuse;
  m.def("conv3d_norm_activation_cuda",
        torch::wrap_pybind_function_no_gil(&block_kernel<at::Tensor, &block_forward_cuda>),
        "torch.ops.cutlassfuse.conv3d_norm_activation's CUDA kernel, called without the dispatcher");
  m.def("group_norm_activation_cuda",
        torch::wrap_pybind_function_no_gil(&norm_kernel<at::Tensor, &norm_activation_forward_cuda>),
        "torch.ops.cutlassfuse.group_norm_activation's CUDA kernel, called without the dispatcher");
#endif
}
