import pytest
import torch
from hypothesis import settings

import cutlassfuse

# CI replays the same examples on every run, so red means a regression, not a new draw;
# `pytest --hypothesis-profile=fuzz` explores fresh random examples (and finds new bugs).
settings.register_profile("default", derandomize=True)
settings.register_profile("fuzz", derandomize=False)
settings.load_profile("default")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and cutlassfuse.info()["cuda_kernels"]:
        return
    reason = "no CUDA device" if not torch.cuda.is_available() else "a build without the CUDA kernels"
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
