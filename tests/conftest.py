import pytest
import torch
from hypothesis import settings

# CI replays the same examples on every run, so red means a regression, not a new draw;
# `pytest --hypothesis-profile=fuzz` explores fresh random examples (and finds new bugs).
settings.register_profile("default", derandomize=True)
settings.register_profile("fuzz", derandomize=False)
settings.load_profile("default")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
