"""On the GPU: gradients against float64, opcheck, CUDA graphs, torch.compile with
inductor, and training a small decoder to the same loss as eager."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import cutlassfuse
from cutlassfuse.testing import errors, fused_path_expected, make_inputs, op_arguments

pytestmark = pytest.mark.gpu

OP = torch.ops.cutlassfuse.conv_transpose3d_relu_group_norm.default
GRAD_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 6e-2}
TENSORS = ("input", "weight", "bias", "norm_weight", "norm_bias")


def layer_call(dtype, requires_grad=True) -> dict:
    """32 -> 64 channels, kernel 3, padding 1, bias and affine: every tensor wants its gradient."""
    return make_inputs(batch=4, in_channels=32, out_channels=64, size=(6, 7, 8), kernel=3, padding=1, num_groups=8,
                       dtype=dtype, device="cuda", seed=5, requires_grad=requires_grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
def test_gradients_against_float64(dtype):
    ours = layer_call(dtype)
    path = cutlassfuse.explain(**layer_call(dtype, requires_grad=False))
    assert path.startswith("fused_sm90") or not fused_path_expected(), path
    reference = {k: v.detach().double().requires_grad_() if isinstance(v, torch.Tensor) else v
                 for k, v in ours.items()}
    grad = torch.randn(4, 64, 6, 7, 8, device="cuda")
    cutlassfuse.conv_transpose3d_relu_group_norm(**ours).backward(grad.to(dtype))
    cutlassfuse.conv_transpose3d_relu_group_norm(**reference).backward(grad.double())
    for name in TENSORS:
        err = errors(ours[name].grad, reference[name].grad)
        assert err.relative <= GRAD_TOLERANCE[dtype], f"{name}: {err}"


def test_opcheck_cuda():
    torch.library.opcheck(OP, op_arguments(layer_call(torch.float16)))


def test_cuda_graph_replay():
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 3, 8, bias=True).cuda().half().eval()
    static_x = torch.rand(4, 32, 10, 10, 10, device="cuda", dtype=torch.half)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            module(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out = module(static_x)
    for _ in range(2):
        static_x.copy_(torch.rand_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            assert torch.equal(static_out, module(static_x))


def test_torch_compile_inductor_fullgraph():
    torch.manual_seed(0)
    model = nn.Sequential(cutlassfuse.ConvTranspose3dReLUGroupNorm(32, 64, 3, 8), nn.Conv3d(64, 8, 1)).cuda().half()
    x = torch.rand(2, 32, 8, 8, 8, device="cuda", dtype=torch.half)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=2e-3, atol=2e-3)


def test_decoder_trains_to_the_same_loss():
    torch.manual_seed(0)
    eager = nn.Sequential(nn.ConvTranspose3d(32, 32, 3, padding=1), nn.ReLU(), nn.GroupNorm(4, 32),
                          nn.ConvTranspose3d(32, 16, 3), nn.ReLU(), nn.GroupNorm(4, 16),
                          nn.Conv3d(16, 1, 1)).cuda().to(torch.bfloat16)
    result = cutlassfuse.fuse(copy.deepcopy(eager))
    assert len(result.replaced) == 2
    x = torch.rand(4, 32, 8, 8, 8, device="cuda", dtype=torch.bfloat16)
    path = cutlassfuse.explain(x, result.model[0].conv_transpose.weight, result.model[0].conv_transpose.bias,
                               padding=1, num_groups=4)
    assert path.startswith("fused_sm90") or not fused_path_expected(), path
    target = torch.randn(4, 1, 10, 10, 10, device="cuda")
    losses = {}
    for name, model in (("eager", eager), ("fused", result.model)):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for _ in range(20):
            optimizer.zero_grad()
            loss = F.mse_loss(model(x).float(), target)
            loss.backward()
            optimizer.step()
        losses[name] = loss.item()
    assert abs(losses["fused"] - losses["eager"]) <= 0.02 * losses["eager"], losses
