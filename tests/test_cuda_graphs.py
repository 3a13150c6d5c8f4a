"""CUDAGraphed's surface where no graph is captured (CPU inputs, training, grad mode):
it calls the module itself, keeps the module's state_dict keys both ways, and refuses a
bad max_graphs; fuse(cuda_graphs=True) returns one."""

import copy
import pickle
from collections import OrderedDict

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse import CUDAGraphed


def block_model() -> nn.Module:
    adn = nn.Sequential(OrderedDict(N=nn.InstanceNorm3d(8, affine=True), A=nn.PReLU()))
    return nn.Sequential(nn.Sequential(OrderedDict(conv=nn.Conv3d(4, 8, 3, padding=1), adn=adn)),
                         nn.Conv3d(8, 2, 1)).eval()


def test_cpu_calls_run_the_module_and_capture_nothing():
    model = block_model()
    graphed = CUDAGraphed(model)
    x = torch.randn(1, 4, 6, 6, 6)
    with torch.no_grad():
        assert torch.equal(graphed(x), model(x))
    assert graphed(x).requires_grad  # grad mode: the module's own forward, tracked
    assert graphed.captured_graphs == 0


def test_state_dict_keys_are_the_modules_both_ways():
    model = block_model()
    graphed = CUDAGraphed(copy.deepcopy(model))
    assert list(graphed.state_dict()) == list(model.state_dict())
    changed = {key: value + 1 for key, value in model.state_dict().items()}
    graphed.load_state_dict(changed, strict=True)
    for key, value in graphed.module.state_dict().items():
        assert torch.equal(value, changed[key])
    model.load_state_dict(graphed.state_dict(), strict=True)
    outer = nn.Sequential(CUDAGraphed(block_model()))  # nested: the prefix of its own path
    assert list(outer.state_dict()) == [f"0.{key}" for key in model.state_dict()]


@pytest.mark.parametrize("max_graphs", [0, -1, 1.5, True, "2"])
def test_max_graphs_must_be_a_positive_int(max_graphs):
    with pytest.raises(ValueError, match="max_graphs must be a positive int"):
        CUDAGraphed(block_model(), max_graphs=max_graphs)


def test_fuse_with_cuda_graphs_wraps_the_fused_model():
    model = block_model()
    result = cutlassfuse.fuse(copy.deepcopy(model), cuda_graphs=True)
    assert isinstance(result.model, CUDAGraphed)
    assert "replay CUDA graphs" in str(result)
    assert list(result.model.state_dict()) == list(model.state_dict())
    x = torch.randn(1, 4, 6, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(result.model(x), model(x), rtol=1e-4, atol=1e-4)
    assert "max_graphs=4" in repr(result.model)


def test_copies_and_pickles_without_graphs():
    graphed = CUDAGraphed(block_model(), max_graphs=2)
    graphed._graphs[("a signature",)] = None  # stands for a kept graph, which neither can copy
    for copied in (copy.deepcopy(graphed), pickle.loads(pickle.dumps(graphed))):
        assert copied.max_graphs == 2 and len(copied._graphs) == 0
        assert list(copied.state_dict()) == list(graphed.state_dict())
    assert len(graphed._graphs) == 1
