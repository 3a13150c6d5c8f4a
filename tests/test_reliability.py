"""What a user's mistakes and limits give: the module built on the meta device, NaN kept
to its (sample, group), out-of-memory as torch.OutOfMemoryError, and one C++ runtime."""

import glob
import os
import shutil
import subprocess

import pytest
import torch
from torch import nn

import cutlassfuse
from cutlassfuse.testing import RELATIVE_TOLERANCE, errors, make_inputs, reference_float64

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _dtype(device):
    return torch.float16 if device == "cuda" else torch.float32


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf (binutils)")
def test_extension_links_the_shared_cpp_runtime():
    """A static C++ runtime copied into the module would run beside the process's own
    (see cpp/cmake/torch.cmake): the module must need libstdc++.so like torch does."""
    module = glob.glob(os.path.join(os.path.dirname(cutlassfuse.__file__), "_C*.so"))[0]
    needed = subprocess.run(["readelf", "-d", module], capture_output=True, text=True, check=True).stdout
    assert "[libstdc++.so" in needed, needed


@pytest.mark.parametrize("device", DEVICES)
def test_module_built_on_meta_then_materialized(device):
    with torch.device("meta"):
        block = cutlassfuse.ConvTranspose3dReLUGroupNorm(16, 32, 3, 8, bias=True, stride=2, padding=1)
    x_meta = torch.empty(2, 16, 5, 5, 5, device="meta", dtype=torch.float32)
    y_meta = block(x_meta)
    assert y_meta.device.type == "meta" and y_meta.shape == (2, 32, 9, 9, 9) and y_meta.dtype == torch.float32
    y_meta_cl = block(x_meta.contiguous(memory_format=torch.channels_last_3d))
    assert y_meta_cl.is_contiguous(memory_format=torch.channels_last_3d)

    torch.manual_seed(0)
    source = cutlassfuse.ConvTranspose3dReLUGroupNorm(16, 32, 3, 8, bias=True, stride=2, padding=1)
    block.to_empty(device=device)
    block.load_state_dict(source.state_dict())
    block.to(_dtype(device))
    x = torch.randn(2, 16, 5, 5, 5, device=device, dtype=_dtype(device))
    conv, norm = block.conv_transpose, block.group_norm
    expected = reference_float64(x, conv.weight, conv.bias, 2, 1, num_groups=8, norm_weight=norm.weight,
                                 norm_bias=norm.bias)
    assert errors(block(x), expected).relative < 2 * RELATIVE_TOLERANCE[x.dtype]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("conv_groups", [1, 2])
def test_nan_stays_in_its_sample_and_group(device, conv_groups):
    """NaN in one sample's input: with one conv group it reaches every channel of that
    sample only; with two conv groups (= GroupNorm groups) only that sample's group. As
    in PyTorch."""
    inputs = make_inputs(batch=3, in_channels=16, out_channels=32, size=6, kernel=3, groups=conv_groups, num_groups=2,
                         bias=False, affine=False, dtype=_dtype(device), device=device)
    x, w = inputs["input"], inputs["weight"]
    x[1, 0, 2, 3, 4] = float("nan")
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**inputs)
    eager = nn.functional.group_norm(nn.functional.relu(nn.functional.conv_transpose3d(x, w, groups=conv_groups)), 2)
    nan_channels = slice(0, 32 // conv_groups)
    assert out[1, nan_channels].isnan().all()
    finite = torch.ones_like(out, dtype=torch.bool)
    finite[1, nan_channels] = False
    assert out[finite].isfinite().all()
    assert torch.equal(out.isnan(), eager.isnan())


@pytest.mark.gpu
def test_out_of_memory_raises_and_leaks_nothing():
    small = make_inputs(batch=2, in_channels=16, out_channels=32, size=6, kernel=3, num_groups=8, bias=False,
                        affine=False, dtype=torch.float16, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    # 16 x 64 x 64^3 fp16 input (537 MB) -> 16 x 64 x 66^3 output and activation (~1.2 GB
    # each): far above 256 MB more than is allocated now.
    large = torch.rand(16, 64, 64, 64, 64, device="cuda", dtype=torch.float16)
    large_weight = torch.randn(64, 64, 3, 3, 3, device="cuda", dtype=torch.float16)
    total = torch.cuda.get_device_properties(0).total_memory
    allocated = torch.cuda.memory_allocated()
    torch.cuda.set_per_process_memory_fraction((allocated + (256 << 20)) / total)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            cutlassfuse.conv_transpose3d_relu_group_norm(large, large_weight, num_groups=8)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() == allocated  # nothing of the failed call is kept
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    del large, large_weight
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before
    out = cutlassfuse.conv_transpose3d_relu_group_norm(**small)
    assert errors(out, reference_float64(**small)).relative < RELATIVE_TOLERANCE[torch.float16]
