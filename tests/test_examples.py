"""The examples run as documented (reduced sizes on the CPU)."""

import importlib.util
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from fuse_checks import randomized

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def run_example(script: str, *args: str) -> str:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, check=True,
                          timeout=600).stdout


@pytest.mark.parametrize("script", ["kernelbench_61.py", "unet_decoder.py"])
def test_example_runs(script):
    out = run_example(script)
    assert out.strip()
    if script == "unet_decoder.py":
        assert "3 chain(s) fused" in out
    if script == "kernelbench_61.py":
        checks = [line for line in out.splitlines() if "allclose(ModelNew, Model" in line]
        assert checks and all(line.endswith("= True") for line in checks), out


def test_monai_example_loads_a_checkpoint_fuses_and_folds(tmp_path):
    """A checkpoint of MONAI's AttentionUnet (random weights and running statistics)
    through the example, channels-last: its InstanceNorm3d chains fused, its BatchNorm3d
    folded, the outputs the original's."""
    pytest.importorskip("monai")
    spec = importlib.util.spec_from_file_location("monai_unet", EXAMPLES / "monai_unet.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    checkpoint = tmp_path / "attention_unet.pt"
    torch.save(randomized(example.NETWORKS["attentionunet"](), seed=0).state_dict(), checkpoint)
    out = run_example("monai_unet.py", "--network", "attentionunet", "--checkpoint", str(checkpoint),
                      "--channels-last", "--cuda-graphs", "--device", "cpu")
    assert out.startswith("cutlassfuse.fuse: 3 chain(s) fused, 20 norm(s) folded into their convolution\n"), out
    assert "inference calls replay CUDA graphs of the fused forward" in out, out
    difference, scale = map(float, re.search(r"max \|fused - eager\| = (\S+), max \|eager\| = (\S+) ", out).groups())
    # float32 through 20 layers of random weights: eager's own error against float64 is
    # 5e-6 of the output's largest value here, the fused model's as much.
    assert difference <= 5e-5 * scale, out


def test_video_vae_example_fuses_every_resnet_block():
    """diffusers' HunyuanVideo decoder (small, random weights) through the example: the
    GroupNorm -> SiLU and Conv3d -> GroupNorm -> SiLU of each of its 10 resnet blocks
    fused, and the decoder's own last GroupNorm -> SiLU (its forward() traced with the
    upsampling blocks, which branch on the frame count, called as they are), the
    replicate pads of its 26 causal convolutions cutlassfuse's (the one of zeros before its
    1x1x1 shortcut convolution dropped), the outputs the original's."""
    out = run_example("video_vae.py", "--device", "cpu")
    assert out.startswith("cutlassfuse.fuse: 21 chain(s) fused\n"), out
    assert "\n  conv_norm_out_silu: GroupNorm(8) + SiLU -> GroupNormActivation\n" in out, out
    assert out.count(": F.pad(mode='replicate', pad=") == 26, out
    assert out.count("-> dropped (pads nothing, read by convolutions only)") == 1, out
    difference, scale = map(float, re.search(r"max \|fused - eager\| = (\S+), max \|eager\| = (\S+) ", out).groups())
    assert difference <= 1e-5 * scale, out
