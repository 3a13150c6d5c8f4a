"""ConvTranspose3dReLUGroupNorm as a drop-in for KernelBench level2/61's Model."""

import gc


import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from cutlassfuse import ConvTranspose3dReLUGroupNorm
from cutlassfuse.packed_copy import PackedCopy
from cutlassfuse.testing import KernelBenchModel


def build_pair(*args, seed=1234, **kwargs):
    torch.manual_seed(seed)
    fused = ConvTranspose3dReLUGroupNorm(*args, **kwargs)
    torch.manual_seed(seed)
    original = KernelBenchModel(*args, **kwargs)
    return fused, original


@pytest.mark.parametrize("bias", [False, True])
def test_state_dict_keys_equal_original(bias):
    fused, original = build_pair(8, 16, 3, 4, bias=bias)
    assert list(fused.state_dict()) == list(original.state_dict())


@pytest.mark.parametrize("bias", [False, True])
def test_same_seed_gives_identical_parameters(bias):
    fused, original = build_pair(8, 16, 3, 4, bias=bias)
    for (name, a), (_, b) in zip(fused.state_dict().items(), original.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # ... and the generator ends where the original leaves it.
    torch.manual_seed(7)
    ConvTranspose3dReLUGroupNorm(8, 16, 3, 4)
    after_fused = torch.rand(4)
    torch.manual_seed(7)
    KernelBenchModel(8, 16, 3, 4)
    assert torch.equal(after_fused, torch.rand(4))


@pytest.mark.parametrize("bias", [False, True])
def test_same_outputs_as_original(bias):
    fused, original = build_pair(8, 16, 3, 4, bias=bias)
    x = torch.rand(2, 8, 5, 6, 7)
    torch.testing.assert_close(fused(x), original(x), rtol=1e-5, atol=1e-5)


def test_loads_original_state_dict():
    fused, original = build_pair(8, 16, 3, 4, bias=True, seed=1)
    _, other = build_pair(8, 16, 3, 4, bias=True, seed=2)
    fused.load_state_dict(other.state_dict())
    x = torch.rand(1, 8, 4, 4, 4)
    torch.testing.assert_close(fused(x), other(x), rtol=1e-5, atol=1e-5)


def test_every_option_reaches_the_op():
    torch.manual_seed(0)
    fused = ConvTranspose3dReLUGroupNorm(6, 12, (3, 2, 4), 3, bias=True, stride=(2, 1, 2), padding=(1, 0, 1),
                                         output_padding=(1, 0, 0), dilation=(1, 2, 1), conv_groups=2, eps=1e-3,
                                         affine=False)
    conv, norm = fused.conv_transpose, fused.group_norm
    x = torch.rand(2, 6, 3, 4, 5)
    expected = norm(torch.relu(conv(x)))
    torch.testing.assert_close(fused(x), expected, rtol=1e-5, atol=1e-5)
    assert list(fused.state_dict()) == ["conv_transpose.weight", "conv_transpose.bias"]


def test_dtype_and_device_arguments():
    fused = ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in fused.parameters())
    assert fused(torch.rand(1, 8, 3, 3, 3, dtype=torch.float64)).dtype == torch.float64


def test_repr_shows_the_options_like_torch_nn():
    """Defaults left out, as nn.ConvTranspose3d and nn.GroupNorm print theirs."""
    plain = ConvTranspose3dReLUGroupNorm(16, 32, 3, 8)
    assert plain.extra_repr() == ("16, 32, kernel_size=(3, 3, 3), stride=(1, 1, 1), bias=False, num_groups=8, "
                                  "eps=1e-05, affine=True")
    every = ConvTranspose3dReLUGroupNorm(16, 32, (3, 2, 3), 4, bias=True, stride=2, padding=1, output_padding=1,
                                         dilation=(1, 2, 1), conv_groups=2, eps=1e-3, affine=False, recompute=True)
    assert every.extra_repr() == ("16, 32, kernel_size=(3, 2, 3), stride=(2, 2, 2), padding=(1, 1, 1), "
                                  "output_padding=(1, 1, 1), dilation=(1, 2, 1), conv_groups=2, num_groups=4, "
                                  "eps=0.001, affine=False, recompute=True")
    assert repr(every).startswith(f"ConvTranspose3dReLUGroupNorm(\n  {every.extra_repr()}\n  (conv_transpose): ")


# The packed weight/bias cache (PackedCopy), exercised on CPU tensors: the module uses it
# for CUDA parameters only, with the same logic.
def counting_pack():
    calls = []

    def pack(source):
        calls.append(source.clone())
        return source.detach().clone()

    return pack, calls


def test_packed_copy_repacks_exactly_when_the_source_changes():
    weight = torch.nn.Parameter(torch.randn(4, 6))
    cache, (pack, calls) = PackedCopy(), counting_pack()
    first = cache.get(weight, pack)
    assert cache.get(weight, pack) is first and len(calls) == 1
    with torch.no_grad():
        weight.mul_(2)  # in place: same storage, new version
    assert torch.equal(cache.get(weight, pack), weight) and len(calls) == 2
    weight.data = torch.randn(4, 6)  # replaced storage
    assert torch.equal(cache.get(weight, pack), weight) and len(calls) == 3
    weight.data = weight.data.as_strided((4, 6), (1, 4))  # same storage and address, other strides
    cache.get(weight, pack)
    assert len(calls) == 4
    cache.get(weight.detach().double(), pack)  # cast
    assert len(calls) == 5


def test_packed_copy_keeps_its_source_storage_alive():
    """No other tensor can take a cached source's address (and so its key) while the copy is kept."""
    cache, (pack, _) = PackedCopy(), counting_pack()
    source = torch.randn(64, 64)
    alive = StorageWeakRef(source.untyped_storage())
    cache.get(source, pack)
    del source
    gc.collect()
    assert not alive.expired()
    cache.get(torch.randn(3), pack)  # the next source replaces the entry
    gc.collect()
    assert alive.expired()


def test_packed_copy_never_keeps_a_view_of_a_larger_buffer():
    """A view of part of a buffer (FSDP's gathered parameters) can be rewritten there
    without a version bump: packed on every call, and an earlier entry dropped."""
    cache, (pack, calls) = PackedCopy(), counting_pack()
    buffer = torch.randn(2, 4, 6)
    cache.get(torch.randn(4, 6), pack)
    for view in (buffer[1], buffer[0], buffer[0]):
        assert torch.equal(cache.get(view, pack), view)
    assert len(calls) == 4 and cache.kept is None


def test_module_drops_packed_copies_when_moved_or_cast():
    fused = ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True)
    pack, calls = counting_pack()

    def copies():
        return fused.__dict__.setdefault("_packed", {})

    copies().setdefault("weight", PackedCopy()).get(fused.conv_transpose.weight, pack)
    fused.double()
    assert copies() == {}
    copies().setdefault("weight", PackedCopy()).get(fused.conv_transpose.weight, pack)
    fused.clear_packed_cache()
    assert copies() == {}


@pytest.mark.parametrize("output_size", [(9, 9, 10), [2, 8, 10, 9, 12]])
def test_output_size_picks_the_output_padding(output_size):
    """As nn.ConvTranspose3d.forward's output_size: (D, H, W), or a full shape."""
    torch.manual_seed(0)
    fused = ConvTranspose3dReLUGroupNorm(4, 8, 3, 2, bias=True, stride=(2, 2, 3), padding=1)
    conv, norm = fused.conv_transpose, fused.group_norm
    x = torch.rand(2, 4, 5, 5, 4)
    expected = norm(torch.relu(conv(x, output_size=output_size)))
    out = fused(x, output_size=output_size)
    assert out.shape == expected.shape and out.shape[2:] == tuple(output_size[-3:])
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fused", [True, False])
def test_packed_copy_follows_optimizer_steps(fused):
    """Fused optimizers write parameters without bumping their version counters."""
    weight = torch.nn.Parameter(torch.randn(4, 6))
    optimizer = torch.optim.Adam([weight], lr=0.1, fused=fused)
    cache, (pack, _) = PackedCopy(), counting_pack()
    cache.get(weight, pack)
    weight.grad = torch.ones_like(weight)
    optimizer.step()
    assert torch.equal(cache.get(weight, pack), weight)


@pytest.mark.parametrize("assign", [False, True])
def test_packed_copy_follows_load_state_dict(assign):
    """load_state_dict copies in place (a new version) or, with assign=True, puts the
    loaded tensors in place of the parameters."""
    block = ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True)
    cache, (pack, _) = PackedCopy(), counting_pack()
    cache.get(block.conv_transpose.weight, pack)
    block.load_state_dict(ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True).state_dict(), assign=assign)
    assert torch.equal(cache.get(block.conv_transpose.weight, pack), block.conv_transpose.weight)


def test_models_holding_the_module_trace_with_torch_fx():
    torch.manual_seed(0)
    model = torch.nn.Sequential(ConvTranspose3dReLUGroupNorm(8, 16, 3, 4, bias=True), torch.nn.Conv3d(16, 4, 1))
    x = torch.rand(1, 8, 3, 3, 3)
    torch.testing.assert_close(torch.fx.symbolic_trace(model)(x), model(x), rtol=0, atol=0)
