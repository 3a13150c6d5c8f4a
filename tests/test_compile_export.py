"""torch.compile (fullgraph, forward and backward) and torch.export through the op."""

import torch
import torch.nn.functional as F

import cutlassfuse


class Decoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = cutlassfuse.ConvTranspose3dReLUGroupNorm(8, 8, 2, 4, bias=True, stride=2)
        self.head = torch.nn.Conv3d(8, 2, 1)

    def forward(self, x):
        return self.head(self.up(x) + 1)


def test_compile_fullgraph_forward_and_backward():
    torch.manual_seed(0)
    model = Decoder()
    x = torch.rand(2, 8, 3, 3, 3)
    expected = model(x)
    expected.sum().backward()
    expected_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, expected)
    for p, g in zip(model.parameters(), expected_grads, strict=True):
        torch.testing.assert_close(p.grad, g)


def test_export():
    torch.manual_seed(0)
    model = Decoder().eval()
    x = torch.rand(2, 8, 3, 3, 3)
    exported = torch.export.export(model, (x,))
    assert any("cutlassfuse.conv_transpose3d_relu_group_norm" in str(n.target) for n in exported.graph.nodes)
    torch.testing.assert_close(exported.module()(x), model(x))


def test_functional_under_compile_with_dynamic_shapes():
    w = torch.randn(4, 8, 3, 3, 3) * 0.2

    def f(x):
        return F.relu(cutlassfuse.conv_transpose3d_relu_group_norm(x, w, num_groups=2)) * 2

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for size in (3, 5):
        x = torch.rand(1, 4, size, size, size)
        torch.testing.assert_close(compiled(x), f(x))


def test_recompute_under_compile_fullgraph():
    torch.manual_seed(0)
    module = cutlassfuse.ConvTranspose3dReLUGroupNorm(4, 8, 3, 2, bias=True, stride=2, padding=1, recompute=True)
    kept = cutlassfuse.ConvTranspose3dReLUGroupNorm.from_modules(module.conv_transpose, module.group_norm)
    x = torch.randn(2, 4, 3, 4, 3, requires_grad=True)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=True)
    got = torch.autograd.grad(compiled(x).sum(), [x, *module.parameters()])
    want = torch.autograd.grad(kept(x).sum(), [x, *kept.parameters()])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
