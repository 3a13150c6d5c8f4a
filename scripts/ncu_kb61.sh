#!/usr/bin/env bash
# Nsight Compute summary of the fused op's kernels on KernelBench level2/61 (fp16,
# NCDHW input), clocks left as found. Usage (on a GPU machine, package installed):
#   bash scripts/ncu_kb61.sh [report-dir]
set -euo pipefail
out="${1:-${OUT:-/tmp}}"
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
"$NCU" --clock-control none --target-processes all \
  --kernel-name-base demangled --kernel-name regex:"ConvUniversal|group_norm|ncdhw_to_ndhwc" \
  --launch-skip 4 --launch-count 4 \
  --section SpeedOfLight --section Occupancy \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
  --csv --page details \
  python3 -c '
import torch, cutlassfuse
m = cutlassfuse.ConvTranspose3dReLUGroupNorm(64, 128, 3, 8).cuda().half()
x = torch.rand(16, 64, 32, 32, 32, device="cuda", dtype=torch.half)
for _ in range(2):
    m(x)
torch.cuda.synchronize()
' > "$out/ncu_kb61.csv"
python3 - "$out/ncu_kb61.csv" <<'PY'
import csv, sys
wanted = {
    "Duration": "duration",
    "Compute (SM) Throughput": "SM %",
    "Memory Throughput": "memory %",
    "Achieved Occupancy": "occupancy %",
    "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor (gmma) %",
}
rows = {}
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    name = r["Kernel Name"]
    short = next((k for k in ("ConvUniversal", "group_norm_apply", "group_norm_finalize", "ncdhw_to_ndhwc") if k in name), name[:30])
    if r["Metric Name"] in wanted:
        rows.setdefault((r["ID"], short), {})[wanted[r["Metric Name"]]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
cols = list(wanted.values())
print("| kernel | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for (_, short), vals in rows.items():
    print(f"| {short} | " + " | ".join(vals.get(c, "-") for c in cols) + " |")
PY
