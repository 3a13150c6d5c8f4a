// Autograd nodes written directly on torch::autograd::Node, as ATen's generated
// backward nodes are: the saved tensors and arguments as members. A
// torch::autograd::Function (CppNode) keeps, per call, type-erased argument info per
// input, a map of saved values and sets of dirty and non-differentiable tensors, and
// builds and frees them on every forward in grad mode (about a tenth of a small layer's
// host time per call).
//
// Torch 2.11 holds nodes in std::shared_ptr (freed through deleteNode, which frees long
// chains without recursion); later releases in c10::intrusive_ptr. make_node gives
// whichever this torch uses.
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace cutlassfuse {

using NodePointer = decltype(torch::autograd::Edge::function);

template <class N, class... Arguments>
NodePointer make_node(Arguments&&... arguments) {
  if constexpr (std::is_same_v<NodePointer, std::shared_ptr<torch::autograd::Node>>) {
    // deleteNode found by argument-dependent lookup (N derives from torch::autograd::Node),
    // at instantiation: torch releases without it never instantiate this branch.
    return std::shared_ptr<N>(new N(std::forward<Arguments>(arguments)...), [](N* node) { deleteNode(node); });
  } else {
    return c10::make_intrusive<N>(std::forward<Arguments>(arguments)...);
  }
}

// The node's inputs carry no forward-mode tangents: these nodes have no forward-mode
// derivative, and a torch::autograd::Function raises for them as well.
template <class... Tensors>
void check_no_forward_gradients(const char* op, const Tensors&... tensors) {
  const bool any = (torch::autograd::isFwGradDefined(tensors) || ...);
  TORCH_CHECK(!any, "cutlassfuse: ", op, " has no forward-mode AD derivative");
}

}  // namespace cutlassfuse
