"""The GPU tests' output poisoning works for the allocator's small and large pools: an
op's output that a kernel fails to write must read back as NaN, not as stale data."""

from __future__ import annotations

import pytest
import torch

from cutlassfuse.testing import poison_cuda_allocator

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("nbytes", [256, 64 << 10, 1 << 20, 24 << 20], ids=["256B", "64KiB", "1MiB", "24MiB"])
def test_fresh_allocations_read_nan_after_poisoning(nbytes):
    stale = [torch.zeros(nbytes // 2, dtype=torch.float16, device="cuda") for _ in range(4)]
    del stale  # the pools now hold zeroed free blocks of this size
    poison_cuda_allocator(nbytes)
    fresh = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    assert fresh.isnan().all()
