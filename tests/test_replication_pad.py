"""torch.ops.cutlassfuse.replication_pad3d on the CPU (ATen's replication_pad3d: the op's
reference) and its fake kernel, fuse() putting it in place of the replicate pads of
traced code, and the video autoencoder benchmark, whose decoder has one before each causal
convolution, on the CPU."""

import copy
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

import cutlassfuse

PAD = torch.ops.cutlassfuse.replication_pad3d.default
CL = torch.channels_last_3d
CAUSAL = (1, 1, 1, 1, 2, 0)  # a video autoencoder's causal 3x3x3 convolution


@pytest.mark.parametrize("padding", [CAUSAL, (0, 0, 0, 0, 0, 0), (3, 0, 2, 5, 0, 7), (-1, 2, 0, 1, 1, -2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_op_on_the_cpu_is_atens_pad(padding, dtype, memory_format):
    x = (torch.randn(2, 3, 4, 5, 6) * 100).to(dtype).contiguous(memory_format=memory_format)
    out, expected = PAD(x, list(padding)), F.pad(x, padding, mode="replicate")
    assert torch.equal(out, expected) and out.stride() == expected.stride()


def test_op_passes_opcheck_in_both_layouts():
    x = torch.randn(2, 3, 4, 5, 6)
    torch.library.opcheck(PAD, (x, list(CAUSAL)))
    torch.library.opcheck(PAD, (x.contiguous(memory_format=CL), [2, 1, 0, 3, 1, 1]))
    torch.library.opcheck(PAD, (torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=True), list(CAUSAL)))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, CL], ids=["ncdhw", "channels_last"])
def test_fake_output_has_the_real_outputs_shape_and_layout(memory_format):
    x = torch.randn(1, 8, 3, 4, 5).contiguous(memory_format=memory_format)
    real = PAD(x, list(CAUSAL))
    with FakeTensorMode() as mode:
        fake = PAD(mode.from_tensor(x), list(CAUSAL))
    assert fake.shape == real.shape and fake.stride() == real.stride() and fake.dtype == real.dtype


def test_op_that_autograd_records_has_atens_derivatives():
    x = torch.randn(1, 2, 3, 4, 5, dtype=torch.float64, requires_grad=True)
    out = PAD(x, list(CAUSAL))
    assert out.grad_fn.name() == "CutlassfuseReplicationPad3DBackward"  # the op's kernel ran, its node recorded
    grad = torch.randn_like(out)
    (expected,) = torch.autograd.grad(F.pad(x, CAUSAL, mode="replicate"), x, grad)
    assert torch.equal(torch.autograd.grad(out, x, grad)[0], expected)
    torch.autograd.gradcheck(lambda t: PAD(t, list(CAUSAL)), (x,))
    torch.autograd.gradgradcheck(lambda t: PAD(t, list(CAUSAL)), (x,))
    tangent = torch.randn_like(x)
    _, jvp = torch.func.jvp(lambda t: PAD(t, list(CAUSAL)), (x.detach(),), (tangent,))
    assert torch.equal(jvp, F.pad(tangent, CAUSAL, mode="replicate"))


def test_invalid_calls_raise_atens_errors():
    with pytest.raises(RuntimeError):
        PAD(torch.randn(2, 3, 4, 5, 6), [1, 1, 1])
    with pytest.raises(RuntimeError):
        PAD(torch.randn(5, 6), list(CAUSAL))
    with pytest.raises(RuntimeError):
        PAD(torch.zeros(1, 1, 2, 2, 2, dtype=torch.bool), list(CAUSAL))


class CausalConv(nn.Module):
    """diffusers' HunyuanVideoCausalConv3d: a replicate pad, then a Conv3d without padding."""

    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, 3)

    def forward(self, x):
        return self.conv(F.pad(x, CAUSAL, mode="replicate"))


class CausalBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = nn.GroupNorm(2, 4)
        self.conv1 = CausalConv(4, 8)
        self.norm2 = nn.GroupNorm(2, 8)
        self.pad = nn.ReplicationPad3d((0, 1, 2, 0, 1, 1))
        self.conv2 = nn.Conv3d(8, 4, 1)

    def forward(self, x):
        h = self.norm2(self.conv1(F.silu(self.norm1(x))))
        return self.conv2(self.pad(F.silu(h)))


def test_fuse_replaces_the_replicate_pads_of_traced_code():
    model = CausalBlock().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert result.replicate_pads == [
        "conv1: F.pad(mode='replicate', pad=(1, 1, 1, 1, 2, 0)) -> cutlassfuse replication_pad3d",
        "pad: ReplicationPad3d((0, 1, 2, 0, 1, 1)) -> cutlassfuse replication_pad3d",
    ]
    assert "conv1: F.pad(mode='replicate'" in str(result)
    targets = [node.target for node in result.model.graph.nodes]
    assert targets.count(PAD) == 2 and F.pad not in targets
    x = torch.randn(2, 4, 3, 5, 6)
    with torch.no_grad():
        assert torch.allclose(result.model(x), model(x), atol=1e-5)
    assert result.model.state_dict().keys() == model.state_dict().keys()


def test_fuse_replaces_the_pads_of_children_traced_on_their_own():
    class Untraceable(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = CausalConv(2, 2)

        def forward(self, x):
            return self.conv(x) if x.shape[2] > 1 else x  # a branch on a size: no trace of the whole

    model = Untraceable().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert result.replicate_pads == [
        "conv: F.pad(mode='replicate', pad=(1, 1, 1, 1, 2, 0)) -> cutlassfuse replication_pad3d"]
    x = torch.randn(1, 2, 3, 4, 5)
    assert torch.equal(result.model(x), model(x))


def test_fuse_drops_pads_of_zeros_that_only_convolutions_read():
    class Shortcut(nn.Module):
        """A causal 1x1x1 convolution's pad of zeros (diffusers' conv_shortcut), and the same
        pad returned besides a convolution's output: its copy then stays."""

        def __init__(self):
            super().__init__()
            self.shortcut = nn.Conv3d(4, 2, 1)
            self.conv = nn.Conv3d(4, 2, 1)

        def forward(self, x):
            y = self.shortcut(F.pad(x, (0, 0, 0, 0, 0, 0), mode="replicate"))
            kept = F.pad(x, (0, 0, 0, 0, 0, 0), mode="replicate")
            return y + self.conv(kept), kept

    model = Shortcut().eval()
    result = cutlassfuse.fuse(copy.deepcopy(model))
    assert result.replicate_pads == [
        "pad: F.pad(mode='replicate', pad=(0, 0, 0, 0, 0, 0)) -> dropped (pads nothing, read by convolutions only)",
        "pad_1: F.pad(mode='replicate', pad=(0, 0, 0, 0, 0, 0)) -> cutlassfuse replication_pad3d",
    ]
    x = torch.randn(1, 4, 2, 3, 3)
    (y, kept), (expected_y, expected_kept) = result.model(x), model(x)
    assert torch.equal(y, expected_y) and torch.equal(kept, expected_kept)
    assert kept.data_ptr() != x.data_ptr()


def test_other_pads_are_left_as_they_are():
    class Pads(nn.Module):
        def __init__(self):
            super().__init__()
            self.hooked = nn.ReplicationPad3d(1)
            self.hooked.register_forward_hook(lambda *_: None)

        def forward(self, x, pads):
            x = F.pad(x, (1, 1, 1, 1, 1, 1))  # zeros
            x = F.pad(x, (1, 1, 1, 1, 1, 1), mode="reflect")
            x = F.pad(x, (1, 1, 1, 1), mode="replicate")  # two dimensions
            x = F.pad(x, pads, mode="replicate")  # pads not known when traced
            return self.hooked(x)

    result = cutlassfuse.fuse(Pads())
    assert result.replicate_pads == []


def test_video_vae_benchmark_runs_on_the_cpu():
    pytest.importorskip("diffusers")
    script = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "video_vae.py"
    out = subprocess.run([sys.executable, str(script), "--device", "cpu", "--dtypes", "float32", "--latent", "2,4,4",
                          "--repeats", "1", "--rounds", "1", "--grad-mode"], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    assert re.search(r"^float32\s+fuse, grad mode\s", out, re.M), out
    expected = ("fuse: 21 chains fused, 25 replicate pads replaced, 1 dropped, 16 convolution biases on bias_add"
                " (10 with a residual), 1 untraced module(s) under the kernel mode")
    assert expected in out, out
    errors = {name: float(error) for name, error in re.findall(r"^float32\s+(eager|fuse)\s.*\s(\S+)$", out, re.M)}
    assert errors.keys() == {"eager", "fuse"}, out
    # float32 against float64: each decoder's own rounding, of one order.
    assert errors["fuse"] <= 10 * errors["eager"] + 1e-6, out


def test_video_vae_benchmark_decodes_through_vae_decode_on_the_cpu():
    pytest.importorskip("diffusers")
    script = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "video_vae.py"
    out = subprocess.run([sys.executable, str(script), "--vae", "wan", "--device", "cpu", "--dtypes", "float32",
                          "--latent", "1,4,4", "--repeats", "1", "--rounds", "1"], capture_output=True, text=True,
                         check=True, timeout=600).stdout
    errors = {name: float(error) for name, error in re.findall(r"^float32\s+(eager|fuse)\s.*\s(\S+)$", out, re.M)}
    assert errors.keys() == {"eager", "fuse"}, out
    assert errors["fuse"] <= 10 * errors["eager"] + 1e-6, out


def test_memory_bound_ops_benchmark_runs_on_the_cpu():
    script = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "memory_bound_ops.py"
    out = subprocess.run([sys.executable, str(script), "--device", "cpu", "--shapes", "1x3x2x5x7,2x4x3x6x9",
                          "--dtypes", "float16,float32", "--repeats", "1", "--rounds", "1"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    row = (r"^(pad|upsample|bias_add|modulation)\s+\d+x\S+\s+(float16|float32)\s+(ncdhw|channels_last)\s.*"
           r"\s(True|False)$")
    rows = re.findall(row, out, re.M)
    assert len(rows) == 32, out
    # the modulation rounds once where ATen's ops round three times
    assert all(equal == "True" for op, *_, equal in rows if op != "modulation"), out
    assert {op for op, *_ in rows} == {"pad", "upsample", "bias_add", "modulation"}, out
