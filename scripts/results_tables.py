"""The results tables of README.md and docs/performance.md, rendered from the bench files
in docs/bench/ (what `python -m cutlassfuse bench --json ...` wrote), so that every number
in them has one source.

    python scripts/results_tables.py           # rewrite the tables between their markers
    python scripts/results_tables.py --check   # exit 1 if a table differs from its bench file

A table sits between `<!-- results:NAME -->` and `<!-- /results:NAME -->`; NAME is a bench
file's stem without `bench-` (`h100`: the 16-bit table of docs/bench/bench-h100.json,
`float32-h100`: the float32 table of docs/bench/bench-float32-h100.json), or `grad-mode-GPU`:
the table of docs/bench/grad-mode-GPU.csv (`benchmarks/grad_mode.py --csv`), or
`blocks-GPU`: the table of docs/bench/blocks-GPU.csv (`benchmarks/blocks.py --csv`), or
`networks-GPU`: the table of docs/bench/networks-GPU.csv (`benchmarks/networks.py --csv`).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "docs" / "performance.md"]
MARKER = re.compile(r"(<!-- results:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def _rows(path: Path) -> tuple[dict, dict[tuple[str, str], dict[str, dict]]]:
    """The file's environment and its NCDHW rows by (shape, dtype), then implementation."""
    data = json.loads(path.read_text())
    cases: dict[tuple[str, str], dict[str, dict]] = {}
    for row in data["rows"]:
        if row["memory_format"] == "ncdhw":
            cases.setdefault((row["shape"], row["dtype"]), {})[row["implementation"]] = row
    return data["environment"], cases


def _ms(rows: dict[str, dict], implementation: str) -> str:
    row = rows.get(implementation)
    return "n/a" if row is None or row["median_ms"] is None else f"{row['median_ms']:.3f}"


def _ratio(rows: dict[str, dict], slower: str, faster: str) -> str:
    if rows.get(slower, {}).get("median_ms") is None or rows.get(faster, {}).get("median_ms") is None:
        return "n/a"
    return f"{rows[slower]['median_ms'] / rows[faster]['median_ms']:.2f}x"


def _error(rows: dict[str, dict], implementation: str) -> str:
    error = rows.get(implementation, {}).get("max_abs_vs_float64")
    return "n/a" if error is None else f"{error:.1e}"


def _heading(environment: dict, command: str) -> str:
    date = environment.get("date", "")
    return (f"{environment['device']}, torch {environment['torch']}{', ' + date if date else ''}: `{command}` "
            "(median ms, NCDHW input, layers with conv bias; the inference columns under `torch.no_grad()`, "
            "the grad-mode ones with parameters that require grad and no backward; max abs error against "
            "float64).\n\n")


def sixteen_bit_table(path: Path) -> str:
    environment, cases = _rows(path)
    lines = ["| shape | dtype | eager | compile | cuDNN conv alone | fallback | cutlassfuse | vs eager "
             "| vs compile | eager, grad mode | cutlassfuse, grad mode | vs eager, grad mode "
             "| error eager / cutlassfuse |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, dtype), rows in cases.items():
        lines.append(" | ".join([
            f"| {shape}", dtype, _ms(rows, "pytorch eager"), _ms(rows, "torch.compile"),
            _ms(rows, "cuDNN conv alone"), _ms(rows, "cutlassfuse fallback"), _ms(rows, "cutlassfuse"),
            _ratio(rows, "pytorch eager", "cutlassfuse"), _ratio(rows, "torch.compile", "cutlassfuse"),
            _ms(rows, "eager (grad mode)"), _ms(rows, "cutlassfuse (grad mode)"),
            _ratio(rows, "eager (grad mode)", "cutlassfuse (grad mode)"),
            f"{_error(rows, 'pytorch eager')} / {_error(rows, 'cutlassfuse')} |"]))
    command = "python -m cutlassfuse bench --json bench.json"
    return _heading(environment, command) + "\n".join(lines) + "\n"


def float32_table(path: Path) -> str:
    environment, cases = _rows(path)
    lines = ["| shape | eager (TF32) | cutlassfuse \"pytorch\" | \"tf32\" | \"bf16x3\" | \"tf32\" vs eager "
             "| eager, TF32 off | cutlassfuse, TF32 off | eager, grad mode | cutlassfuse, grad mode "
             "| error eager / \"tf32\" / \"bf16x3\" |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (shape, _), rows in cases.items():
        lines.append(" | ".join([
            f"| {shape}", _ms(rows, "pytorch eager"), _ms(rows, "cutlassfuse"), _ms(rows, "cutlassfuse tf32"),
            _ms(rows, "cutlassfuse bf16x3"), _ratio(rows, "pytorch eager", "cutlassfuse tf32"),
            _ms(rows, "pytorch eager, TF32 off"), _ms(rows, "cutlassfuse, TF32 off"),
            _ms(rows, "eager (grad mode)"), _ms(rows, "cutlassfuse (grad mode)"),
            f"{_error(rows, 'pytorch eager')} / {_error(rows, 'cutlassfuse tf32')} / "
            f"{_error(rows, 'cutlassfuse bf16x3')} |"]))
    command = "python -m cutlassfuse bench --dtypes float32 --no-compile --repeats 30 --json bench-float32.json"
    return _heading(environment, command) + "\n".join(lines) + "\n"


def grad_mode_table(path: Path) -> str:
    rows = list(csv.DictReader(path.open()))
    lines = ["| shape | dtype / mode | path | eager, no_grad | eager, grad mode | cutlassfuse, no_grad "
             "| cutlassfuse, grad mode | grad mode / no_grad | vs eager, grad mode |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(" | ".join([
            f"| {r['shape']}", r["case"], r["path"], *(f"{float(r[k]):.3f}" for k in (
                "eager_no_grad_ms", "eager_grad_ms", "cutlassfuse_no_grad_ms", "cutlassfuse_grad_ms")),
            f"{float(r['grad_over_no_grad']):.2f}", f"{float(r['speedup_over_eager_grad']):.2f}x |"]))
    within = sum(float(r["grad_over_no_grad"]) <= 1.10 for r in rows)
    return (f"`python benchmarks/grad_mode.py --csv {path.name}` (median ms over rounds; layers with "
            f"conv bias, NCDHW input; \"fallback\" cases with the fused path turned off). Grad mode is within "
            f"1.10x of no_grad on {within} of {len(rows)} rows.\n\n" + "\n".join(lines) + "\n")


def _optional_ms(value: str) -> str:
    return f"{float(value):.3f}" if value else "n/a"


def _optional_ratio(value: str) -> str:
    return f"{float(value):.2f}x" if value else "n/a"


def blocks_table(path: Path) -> str:
    rows = list(csv.DictReader(path.open()))
    lines = ["| block | dtype | input | cuDNN conv | one copy | eager | compile | cutlassfuse | vs floor "
             "| vs eager | vs compile | grad mode eager / cutlassfuse | training step eager / cutlassfuse "
             "| error eager / cutlassfuse |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        training = (f"{_optional_ms(r['eager_train_ms'])} / {_optional_ms(r['cutlassfuse_train_ms'])}"
                    if r["eager_train_ms"] else "n/a")
        errors = f"{float(r['eager_max_abs']):.1e} / {float(r['cutlassfuse_max_abs']):.1e}"
        lines.append(" | ".join([
            f"| {r['block']}", r["dtype"], r["memory_format"], _optional_ms(r["conv_ms"]), _optional_ms(r["copy_ms"]),
            _optional_ms(r["eager_ms"]), _optional_ms(r["compile_ms"]), _optional_ms(r["cutlassfuse_ms"]),
            f"{float(r['over_floor']):.2f}", _optional_ratio(r["eager_over_cutlassfuse"]),
            _optional_ratio(r["compile_over_cutlassfuse"]), _grad_mode_pair(r, "eager", "cutlassfuse"), training,
            f"{errors} |"]))
    return (f"`python benchmarks/blocks.py --train --csv {path.name}` (median ms of alternating rounds, under "
            "`torch.no_grad()`, and in grad mode (parameters requiring grad, no backward); \"vs floor\": "
            "cutlassfuse over cuDNN's convolution with its bias plus one copy of the output, or one copy of the "
            "input for the norm alone; max abs error against float64).\n\n"
            + "\n".join(lines) + "\n")


def _grad_mode_pair(row: dict, first: str, second: str) -> str:
    """The two grad-mode times, n/a in files measured before they were."""
    times = [row.get(f"{name}_grad_mode_ms") for name in (first, second)]
    return " / ".join(_optional_ms(t) for t in times) if all(times) else "n/a"


def _optional_error(value: str | None) -> str:
    return f"{float(value):.1e}" if value else "n/a"


def networks_table(path: Path) -> str:
    rows = list(csv.DictReader(path.open()))
    lines = ["| network | dtype | input | blocks fused | eager | compile | fuse | fuse, then compile | vs eager "
             "| vs compile | CUDA graphs: compile / fuse | norm kernels eager / fuse | grad mode eager / fuse "
             "| training step eager / fuse | error eager / fuse | gradient error eager / fuse |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(" | ".join([
            f"| {r['network']}", r["dtype"], r["memory_format"], r["chains_fused"], _optional_ms(r["eager_ms"]),
            _optional_ms(r["compile_ms"]), _optional_ms(r["fused_ms"]), _optional_ms(r["compile_fused_ms"]),
            f"{float(r['eager_ms']) / float(r['fused_ms']):.2f}x",
            f"{float(r['compile_ms']) / float(r['fused_ms']):.2f}x" if r["compile_ms"] else "n/a",
            f"{_optional_ms(r['compile_graphs_ms'])} / {_optional_ms(r['graphed_ms'])}",
            f"{_optional_ms(r['eager_norm_ms'])} / {_optional_ms(r['fused_norm_ms'])}",
            _grad_mode_pair(r, "eager", "fused"),
            f"{_optional_ms(r['eager_train_ms'])} / {_optional_ms(r['fused_train_ms'])}",
            f"{float(r['eager_max_abs']):.1e} / {float(r['fused_max_abs']):.1e}",
            # Files written before the gradient errors were measured have no such columns.
            f"{_optional_error(r.get('eager_grad_max_abs'))} / {_optional_error(r.get('fused_grad_max_abs'))} |"]))
    dtypes = ",".join(dict.fromkeys(r["dtype"] for r in rows))
    dtype_option = "" if dtypes == "float16" else f" --dtypes {dtypes}"
    return (f"`python benchmarks/networks.py{dtype_option} --memory-formats ncdhw --train --csv {path.name}` (median "
            "ms of alternating rounds, eval mode under `torch.no_grad()`; CUDA graphs: "
            "`torch.compile(mode=\"reduce-overhead\")` of the network and `fuse(model, cuda_graphs=True)`, each "
            "replaying CUDA graphs; norm kernels: their GPU time per call; "
            "grad mode: eval mode, parameters requiring grad, no `torch.no_grad()` and no backward; "
            "training step: forward and backward in train mode; max abs error against the float64 network; "
            "gradient error: the max abs error of all parameter gradients against the float64 network's, for one "
            "output gradient).\n\n" + "\n".join(lines) + "\n")


def render(name: str) -> str:
    if name.startswith("networks-"):
        return networks_table(ROOT / "docs" / "bench" / f"{name}.csv")
    if name.startswith("blocks-"):
        return blocks_table(ROOT / "docs" / "bench" / f"{name}.csv")
    if name.startswith("grad-mode-"):
        return grad_mode_table(ROOT / "docs" / "bench" / f"{name}.csv")
    path = ROOT / "docs" / "bench" / f"bench-{name}.json"
    return float32_table(path) if name.startswith("float32-") else sixteen_bit_table(path)


def updated(text: str) -> str:
    return MARKER.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a table differs from its bench file")
    args = parser.parse_args()
    stale = []
    for document in DOCUMENTS:
        text = document.read_text()
        new = updated(text)
        if new != text:
            stale.append(document.relative_to(ROOT))
            if not args.check:
                document.write_text(new)
    if args.check and stale:
        print(f"tables differ from docs/bench: {', '.join(map(str, stale))} (python scripts/results_tables.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
