import pytest
import torch
from hypothesis import settings

import cutlassfuse
from cutlassfuse.testing import fused_path_expected

# CI replays the same examples on every run, so red means a regression, not a new draw;
# `pytest --hypothesis-profile=fuzz` explores fresh random examples (and finds new bugs).
settings.register_profile("default", derandomize=True)
settings.register_profile("fuzz", derandomize=False)
settings.load_profile("default")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires_sm90: needs the fused sm90 path, a Hopper GPU (sm_90) and a build with the CUDA kernels "
                   "(cutlassfuse.testing.fused_path_expected()); skipped elsewhere")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available() or not cutlassfuse.info()["cuda_kernels"]:
        reason = "no CUDA device" if not torch.cuda.is_available() else "a build without the CUDA kernels"
        skip_gpu = pytest.mark.skip(reason=reason)
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
    if not fused_path_expected():
        skip_sm90 = pytest.mark.skip(reason="the fused path runs on Hopper GPUs (sm_90) only")
        for item in items:
            if "requires_sm90" in item.keywords:
                item.add_marker(skip_sm90)


@pytest.fixture(scope="module")
def strict_float32():
    """float32 convolutions without TF32 and with deterministic algorithms
    (torch.backends.cudnn's switches), as a user who wants float32 close to float64 and
    repeatable sets them: the op's default float32 mode follows those switches, so tests
    holding float32 to float64 within 1e-4, bit for bit across runs, run under them."""
    with torch.backends.cudnn.flags(enabled=True, deterministic=True, allow_tf32=False):
        yield
