"""benchmarks/blocks.py on the CPU in its tiny mode: every block runs in both memory
formats with every column, and cutlassfuse's error against float64 is eager's order (the
GPU runs the same code at full size)."""

import csv
import subprocess
import sys
from pathlib import Path

from cutlassfuse import block_bench
from cutlassfuse.block_bench import Row, misses

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "blocks.py"
BLOCKS = ["basicunet_conv", "dynunet_conv", "unet_down", "unet_up", "segres_conv", "upsampler_conv", "segres_norm",
          "kb61"]


def test_block_benchmark_runs_every_block_on_cpu(tmp_path):
    out_csv = tmp_path / "blocks.csv"
    result = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--dtypes", "float32",
                             "--no-compile", "--train", "--rounds", "1", "--repeats", "1", "--csv", str(out_csv)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["block"], r["memory_format"]) for r in rows] == [(f"{name}-tiny", layout) for name in BLOCKS
                                                                for layout in ("ncdhw", "channels_last")]
    for r in rows:
        assert r["notes"] == "", r  # nothing refused
        standalone_norm = r["block"] == "segres_norm-tiny"
        assert (r["conv_ms"] == "") == standalone_norm, r
        assert (r["existing_op_ms"] == "") == (r["block"] != "kb61-tiny"), r
        assert r["compile_ms"] == "" and r["compile_over_cutlassfuse"] == "", r
        for key in ("copy_ms", "eager_ms", "cutlassfuse_ms", "eager_train_ms", "cutlassfuse_train_ms"):
            assert float(r[key]) > 0, (key, r)
        floor = float(r["copy_ms"]) + (0.0 if standalone_norm else float(r["conv_ms"]))
        assert float(r["over_floor"]) == float(r["cutlassfuse_ms"]) / floor
        assert float(r["eager_max_abs"]) <= 1e-4 and float(r["cutlassfuse_max_abs"]) <= 1e-4, r
    assert f"of {len(rows)} rows miss a target" in result.stdout


def _row(**ratios) -> Row:
    fields = {name: None for name in Row.__dataclass_fields__}
    return Row(**{**fields, "block": "b", "dtype": "float16", "memory_format": "ncdhw", "cutlassfuse_ms": 1.0,
                  "path": "fused_sm90", "misses": "", "notes": "", **ratios})


def test_misses_name_each_target_and_basicunet_conv_may_be_within_1_1x_of_compile():
    by_name = {block.name: block for block in block_bench.BLOCKS}
    segres, basicunet = by_name["segres_conv"], by_name["basicunet_conv"]
    assert misses(segres, _row(over_floor=1.0, eager_over_cutlassfuse=2.0, compile_over_cutlassfuse=1.01)) == ""
    assert misses(segres, _row(over_floor=1.2, eager_over_cutlassfuse=1.5, compile_over_cutlassfuse=0.99)) == (
        "over floor > 1.1; eager/cf < 1.75; not faster than compile")
    # basicunet_conv is its convolution: within 1.1x of torch.compile (which calls cuDNN's) counts.
    assert misses(basicunet, _row(compile_over_cutlassfuse=0.99)) == ""
    assert misses(basicunet, _row(compile_over_cutlassfuse=1 / 1.12)) == "over compile >= 1.1"
