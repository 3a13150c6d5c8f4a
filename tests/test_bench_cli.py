"""The bench CLI: shape handling and arithmetic, and every option on the CPU in its tiny
mode (the GPU runs the same code at full size)."""

import csv
import json

import pytest
import torch

from cutlassfuse import bench
from cutlassfuse.__main__ import main
from cutlassfuse.bench import DEFAULT_SHAPES, parse_shape


def test_default_shapes_match_the_baselines():
    kb61 = parse_shape("kb61")
    assert kb61.output_size() == (34, 34, 34)
    assert kb61.useful_flops() / 1e9 == pytest.approx(231.9, abs=0.1)  # 2 * N * Cin * D*H*W * Cout * k^3
    assert parse_shape("vid_k3s2p1op1").output_size() == (16, 64, 64)
    assert parse_shape("gan_k4s2p1").output_size() == (16, 16, 16)
    assert [s.name for s in DEFAULT_SHAPES] == ["kb61", "kb61_v0", "unet_k2s2", "gan_k4s2p1", "vid_k3s2p1op1"]


def test_custom_shape():
    shape = parse_shape("2,8,16,4,4,4,3,2,1,1,4")
    assert (shape.batch, shape.in_channels, shape.out_channels, shape.stride, shape.groups) == (2, 8, 16, 2, 4)
    assert shape.output_size() == (8, 8, 8)


@pytest.mark.parametrize("text", ["1,2,3", "kb62"])
def test_bad_shape_is_explained(text):
    with pytest.raises(ValueError, match="give a name"):
        parse_shape(text)


@pytest.mark.parametrize("options", [
    ["--shapes", "kb61,unet_k2s2", "--dtypes", "float16,bfloat16,float32", "--memory-formats", "ncdhw,channels_last"],
    ["--shapes", "gan_k4s2p1,vid_k3s2p1op1,kb61_v0", "--dtypes", "float32"],
    ["--shapes", "2,8,16,4,4,4,3,2,1,1,4;1,16,8,3,5,4,2,2,0,0,2", "--memory-formats", "channels_last"],
], ids=["dtypes-formats", "default-shapes", "custom-shapes"])
def test_bench_runs_every_option_on_cpu(options, tmp_path, capsys):
    out_csv, out_json = tmp_path / "bench.csv", tmp_path / "bench.json"
    assert main(["bench", "--device", "cpu", "--tiny", "--no-compile", "--repeats", "2", *options,
                 "--csv", str(out_csv), "--json", str(out_json)]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader(out_csv.open()))
    cases = {(r["shape"], r["dtype"], r["memory_format"]) for r in rows}
    float32_modes = {"pytorch eager, TF32 off", "cutlassfuse, TF32 off", "cutlassfuse tf32", "cutlassfuse bf16x3"}
    for case in cases:
        names = {r["implementation"] for r in rows if (r["shape"], r["dtype"], r["memory_format"]) == case}
        expected = {"pytorch eager", "cuDNN conv alone", "CUTLASS conv alone", "cutlassfuse fallback", "cutlassfuse",
                    "eager (grad mode)", "cutlassfuse (grad mode)"}
        assert names == expected | (float32_modes if case[1] == "float32" else set()), case
    for r in rows:
        runs_here = r["implementation"] not in ("cuDNN conv alone", "CUTLASS conv alone", "cutlassfuse fallback",
                                                "cutlassfuse tf32", "cutlassfuse bf16x3")
        if runs_here:
            assert float(r["median_ms"]) > 0 and float(r["max_abs_vs_float64"]) < 1e-1, r
        else:
            assert r["median_ms"] == "" and r["note"].startswith("n/a"), r
    assert "n/a" in printed
    assert json.loads(out_json.read_text())["environment"]["device"] == "CPU"


def test_only_the_grad_mode_rows_are_tracked(monkeypatch):
    tracked = []

    def recording_time_rotating(fn, inputs, warmup, repeats):
        tracked.append(fn(inputs[0]).requires_grad)
        return bench.Timing(1.0, 1.0, 1.0)

    monkeypatch.setattr(bench, "time_rotating", recording_time_rotating)
    rows = bench.bench_case(parse_shape("kb61_v0").tiny(), torch.float32, False, with_compile=False, warmup=0,
                            repeats=1, device=torch.device("cpu"))
    timed = [r.implementation for r in rows if r.median_ms is not None]
    assert dict(zip(timed, tracked, strict=True)) == {name: name.endswith("(grad mode)") for name in timed}
    assert {"eager (grad mode)", "cutlassfuse (grad mode)"} <= set(timed)


def test_bench_compiles_on_cpu(capsys):
    assert main(["bench", "--device", "cpu", "--tiny", "--repeats", "2", "--shapes", "kb61_v0", "--dtypes",
                 "float32"]) == 0
    assert "torch.compile" in capsys.readouterr().out


def test_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "speedups.png"
    main(["bench", "--device", "cpu", "--tiny", "--no-compile", "--repeats", "1", "--shapes", "kb61_v0",
          "--plot", str(plot)])
    assert plot.stat().st_size > 0


@pytest.mark.parametrize("option", ["--repeats=0", "--device=tpu"])
def test_bench_rejects_bad_values(option):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", option])
    assert exit_info.value.code == 2


def test_bench_runs_the_block_family_on_cpu(tmp_path, capsys):
    path = tmp_path / "blocks.csv"
    assert main(["bench", "--blocks", "unet_down,segres_norm", "--device", "cpu", "--tiny", "--no-compile",
                 "--dtypes", "float32", "--memory-formats", "channels_last", "--repeats", "2", "--train",
                 "--csv", str(path)]) == 0
    rows = list(csv.DictReader(path.open()))
    assert [r["block"] for r in rows] == ["unet_down-tiny", "segres_norm-tiny"]
    assert all(float(r["cutlassfuse_ms"]) > 0 and float(r["cutlassfuse_train_ms"]) > 0 for r in rows)
    with pytest.raises(SystemExit, match="unknown blocks"):
        main(["bench", "--blocks", "resnet", "--device", "cpu", "--tiny"])
