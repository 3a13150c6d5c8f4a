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

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <array>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cutlassfuse/op.h"

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

// Records a call autograd tracks: a new `N` with edges to `inputs` (tensors, optional
// tensors: an absent one an empty edge), filled by `save` with what its derivative reads,
// then made `out`'s grad_fn.
template <class N, class Save, class... Inputs>
void record_node(at::Tensor& out, Save&& save, const Inputs&... inputs) {
  NodePointer node = make_node<N>();
  auto& n = static_cast<N&>(*node);
  n.set_next_edges(torch::autograd::collect_next_edges(inputs...));
  save(n);
  torch::autograd::set_history(out, node);
}

// The node's inputs carry no forward-mode tangents: these nodes have no forward-mode
// derivative, and a torch::autograd::Function raises for them as well.
template <class... Tensors>
void check_no_forward_gradients(const char* op, const Tensors&... tensors) {
  const bool any = (torch::autograd::isFwGradDefined(tensors) || ...);
  TORCH_CHECK(!any, "cutlassfuse: ", op, " has no forward-mode AD derivative");
}

// The saved tensors, unpacked (undefined where the call passed none).
template <size_t N>
torch::autograd::variable_list unpack_all(const std::array<torch::autograd::SavedVariable, N>& saved) {
  torch::autograd::variable_list tensors(N);
  for (size_t i = 0; i < N; ++i) tensors[i] = saved[i].unpack();
  return tensors;
}

template <size_t N>
void release_all(std::array<torch::autograd::SavedVariable, N>& saved) {
  for (torch::autograd::SavedVariable& s : saved) s.reset_data();
}

// The gradients of the inputs that need one, as a graph of their own: `out` recomputed
// from `inputs` with ATen's differentiable ops, differentiated by autograd with
// create_graph, so that a second backward runs through it (double backward).
inline torch::autograd::variable_list differentiable_gradients(const at::Tensor& out,
                                                               const torch::autograd::variable_list& inputs,
                                                               const std::vector<bool>& need, const at::Tensor& grad) {
  torch::autograd::variable_list wanted;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (need[i]) wanted.push_back(inputs[i]);
  }
  const torch::autograd::variable_list found =
      torch::autograd::grad({out}, wanted, {grad}, /*retain_graph=*/true, /*create_graph=*/true, /*allow_unused=*/true);
  torch::autograd::variable_list grads(inputs.size());
  for (size_t i = 0, next = 0; i < inputs.size(); ++i) {
    if (need[i]) grads[i] = found[next++];
  }
  return grads;
}

// A convolution's geometry as a node keeps it (three values per list, as validated).
struct SavedConvGeometry {
  std::array<int64_t, 3> stride{}, padding{}, output_padding{}, dilation{};
  int64_t groups = 1;

  void save(at::IntArrayRef stride_, at::IntArrayRef padding_, at::IntArrayRef output_padding_,
            at::IntArrayRef dilation_, int64_t groups_) {
    auto three = [](at::IntArrayRef v) { return std::array<int64_t, 3>{v[0], v[1], v[2]}; };
    stride = three(stride_);
    padding = three(padding_);
    output_padding = three(output_padding_);
    dilation = three(dilation_);
    groups = groups_;
  }
  // Views of this object's arrays: valid while it lives.
  ConvTransposeGeometry geometry() const { return {stride, padding, output_padding, dilation, groups}; }
};

// Which of a node's outputs (its inputs' gradients) the running backward wants.
inline std::vector<bool> wanted_gradients(const torch::autograd::Node& node) {
  std::vector<bool> need(node.num_outputs());
  for (size_t i = 0; i < need.size(); ++i) need[i] = node.task_should_compute_output(i);
  return need;
}

// A backward node with what its forward saved for it: the differentiable inputs (undefined
// where the call passed none), the norm's per-(sample, group) mean and rstd, and `kept`,
// the activation or convolution output the forward kept where it keeps one. The engine
// releases them once a backward has run without retain_graph.
template <size_t Inputs>
struct SavingNode : torch::autograd::Node {
  std::array<torch::autograd::SavedVariable, Inputs> inputs;
  torch::autograd::SavedVariable kept, mean, rstd;

  // Saves them; `kept` may be undefined.
  void save(const std::array<at::Tensor, Inputs>& differentiable, const at::Tensor& kept_tensor,
            const at::Tensor& mean_tensor, const at::Tensor& rstd_tensor) {
    for (size_t i = 0; i < Inputs; ++i) inputs[i] = torch::autograd::SavedVariable(differentiable[i], false);
    kept = torch::autograd::SavedVariable(kept_tensor, false);
    mean = torch::autograd::SavedVariable(mean_tensor, false);
    rstd = torch::autograd::SavedVariable(rstd_tensor, false);
  }

  // No gradients where none reached the output; else the node's own, from the saved
  // inputs and which of the inputs' gradients the running backward wants.
  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) final {
    if (!grads[0].defined()) return torch::autograd::variable_list(num_outputs());
    return input_gradients(grads[0], unpack_all(inputs), wanted_gradients(*this));
  }

  virtual torch::autograd::variable_list input_gradients(const at::Tensor& grad,
                                                         const torch::autograd::variable_list& saved,
                                                         const std::vector<bool>& need) = 0;

  void release_variables() override {
    release_all(inputs);
    kept.reset_data();
    mean.reset_data();
    rstd.reset_data();
  }
};

}  // namespace cutlassfuse
