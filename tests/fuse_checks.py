"""Checks shared by the cutlassfuse.fuse tests: checkpoints saved from a model load
into its fused copy and back, with strict=True; those of a model whose norms fuse()
folded load one way."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import cutlassfuse


def randomized(model: nn.Module, seed: int) -> nn.Module:
    """`model` in eval mode with every parameter drawn from `seed` (the norms' too, which
    start at 1 and 0), and the norms' running statistics (which start at 0 and 1)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.5)
        for module in model.modules():
            if getattr(module, "running_var", None) is not None:
                module.running_mean.copy_(torch.randn(module.running_mean.shape, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(module.running_var.shape, generator=generator) + 0.5)
    return model.eval()


def saved_and_loaded(state_dict: dict) -> dict:
    """`state_dict` written to a checkpoint file's bytes and read back."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_checkpoints_load_both_ways(make, inputs: tuple) -> nn.Module:
    """A state_dict saved from the original model (`make()`) loads into the fused one,
    one saved from the fused model into the original, and one into a second fused model,
    with strict=True: the same keys in the same order, the same outputs. Returns the
    fused model."""
    original = randomized(make(), seed=0)
    expected = original(*inputs)
    fused = cutlassfuse.fuse(randomized(make(), seed=1)).model
    assert fused.load_state_dict(saved_and_loaded(original.state_dict()), strict=True)
    torch.testing.assert_close(fused(*inputs), expected)

    assert list(fused.state_dict()) == list(original.state_dict())
    restored = randomized(make(), seed=2)
    restored.load_state_dict(saved_and_loaded(fused.state_dict()), strict=True)
    assert torch.equal(restored(*inputs), expected)

    refused = cutlassfuse.fuse(randomized(make(), seed=3)).model
    refused.load_state_dict(fused.state_dict(), strict=True)
    torch.testing.assert_close(refused(*inputs), expected)
    return fused


def assert_folded_checkpoints_load(make, inputs: tuple) -> nn.Module:
    """For a model whose norms fuse() folds (`make()`, in eval mode): a state_dict saved
    from the original model loads into the folded one with strict=True, refolding, and
    one saved from the folded model into a second folded model; the original model does
    not load the folded one's (the norms' keys are missing). Returns the folded model."""
    original = randomized(make(), seed=0)
    expected = original(*inputs)
    folded = cutlassfuse.fuse(randomized(make(), seed=1)).model
    folded.load_state_dict(saved_and_loaded(original.state_dict()), strict=True)
    torch.testing.assert_close(folded(*inputs), expected, rtol=1e-10, atol=1e-10)

    refolded = cutlassfuse.fuse(randomized(make(), seed=2)).model
    refolded.load_state_dict(saved_and_loaded(folded.state_dict()), strict=True)
    torch.testing.assert_close(refolded(*inputs), expected, rtol=1e-10, atol=1e-10)
    with pytest.raises(RuntimeError, match="Missing key"):
        randomized(make(), seed=3).load_state_dict(folded.state_dict(), strict=True)
    return folded
