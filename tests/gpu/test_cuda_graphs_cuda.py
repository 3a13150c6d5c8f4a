"""On the GPU: CUDAGraphed replays a captured graph of a fused model's forward (the
module's forward is not called again), bitwise equal to the forward itself, one graph
per input signature and setting, captured again when a parameter changes in place or a
submodule is assigned, never under autograd, and its outputs are the caller's own."""

import copy
from collections import OrderedDict

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse import CUDAGraphed

pytestmark = pytest.mark.gpu


def block_model() -> nn.Module:
    adn = nn.Sequential(OrderedDict(N=nn.InstanceNorm3d(32, affine=True), A=nn.LeakyReLU(0.1)))
    return nn.Sequential(nn.Sequential(OrderedDict(conv=nn.Conv3d(32, 32, 3, padding=1), adn=adn)),
                         nn.ConvTranspose3d(32, 16, 2, stride=2), nn.GroupNorm(4, 16), nn.ReLU(),
                         nn.Conv3d(16, 2, 1))


def fused_and_graphed(max_graphs: int = 4):
    torch.manual_seed(0)
    model = block_model().cuda().half().eval()
    fused = cutlassfuse.fuse(model).model
    graphed = CUDAGraphed(copy.deepcopy(fused), max_graphs=max_graphs)
    calls = []
    graphed.module.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape))
    return fused, graphed, calls


def inputs(n=3, size=8):
    return [torch.randn(2, 32, size, size, size, device="cuda", dtype=torch.half) for _ in range(n)]


def test_replays_bitwise_equal_to_the_forward_without_calling_it():
    fused, graphed, calls = fused_and_graphed()
    with torch.no_grad():
        for x in inputs():
            assert torch.equal(graphed(x), fused(x))
    assert graphed.captured_graphs == 1
    assert len(calls) == 3  # two warm-up forwards and the capture; the three calls replayed


def test_outputs_are_not_overwritten_by_the_next_replay():
    fused, graphed, _ = fused_and_graphed()
    x1, x2 = inputs(2)
    with torch.no_grad():
        y1 = graphed(x1)
        graphed(x2)
        assert torch.equal(y1, fused(x1))


def test_one_graph_per_signature_and_setting_the_oldest_dropped():
    fused, graphed, calls = fused_and_graphed(max_graphs=2)
    small, large = inputs(1, 8)[0], inputs(1, 16)[0]
    with torch.no_grad():
        for x in (small, large, small, large):
            assert torch.equal(graphed(x), fused(x))
        assert graphed.captured_graphs == 2 and len(calls) == 6
        with cutlassfuse.backends.flags(fused_path=False):
            assert torch.equal(graphed(small), fused(small))
        assert graphed.captured_graphs == 2 and len(calls) == 9  # a third signature, the oldest dropped
        graphed(large)
        assert len(calls) == 9
        graphed(small)
        assert len(calls) == 12  # the dropped one captured again


def test_parameters_changed_in_place_or_assigned_are_read_anew():
    fused, graphed, calls = fused_and_graphed()
    x = inputs(1)[0]
    with torch.no_grad():
        graphed(x)
        for module in (fused, graphed.module):
            module[4].weight.mul_(2)
        assert torch.equal(graphed(x), fused(x))
        assert len(calls) == 6
        replacement = nn.Conv3d(16, 2, 1).cuda().half()
        fused[4] = replacement
        graphed.module[4] = copy.deepcopy(replacement)
        assert torch.equal(graphed(x), fused(x))
        assert len(calls) == 9


def test_autograd_calls_run_the_forward():
    fused, graphed, calls = fused_and_graphed()
    x = inputs(1)[0]
    y = graphed(x)
    assert y.requires_grad and len(calls) == 1 and graphed.captured_graphs == 0
    y.float().mean().backward()
    assert graphed.module[4].weight.grad is not None


def test_training_mode_and_autocast_run_the_forward():
    _, graphed, calls = fused_and_graphed()
    x = inputs(1)[0]
    with torch.no_grad():
        graphed.train()
        graphed(x)
        graphed.eval()
        with torch.autocast("cuda", dtype=torch.float16):
            graphed(x)
    assert len(calls) == 2 and graphed.captured_graphs == 0


def test_inference_mode_and_no_grad_keep_their_own_graphs():
    fused, graphed, calls = fused_and_graphed()
    x = inputs(1)[0]
    with torch.inference_mode():
        in_inference_mode = graphed(x)
    with torch.no_grad():  # the graph's inputs of inference mode are inference tensors: not reused here
        under_no_grad = graphed(x)
        assert torch.equal(under_no_grad, fused(x))
    assert torch.equal(in_inference_mode, under_no_grad)
    assert graphed.captured_graphs == 2 and len(calls) == 6
