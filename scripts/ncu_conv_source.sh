#!/usr/bin/env bash
# Where the fused conv kernel's warps stall, per CUDA source line and SASS instruction:
# one fp16 call of SHAPE (default kb61; channels-last input, so the conv is the first
# kernel), the conv kernel alone under ncu's full set with source import, exported as
# CSV pages.
#   SHAPE=unet_k2s2 bash scripts/ncu_conv_source.sh [output folder]
# Clocks are left as found (--clock-control none).
set -euo pipefail
cd "$(dirname "$0")/.."
NCU="${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}"
OUT_DIR="${1:-/tmp}"
SHAPE="${SHAPE:-kb61}"
mkdir -p "$OUT_DIR"
"$NCU" --clock-control none --profile-from-start off --kernel-name-base demangled \
  --kernel-name 'regex:PingpongPhasesKernel|ConvUniversal' \
  --launch-count 1 --set full --import-source yes -f -o "$OUT_DIR/conv" \
  python3 -m cutlassfuse.profiling "$SHAPE" float16 channels_last
"$NCU" --import "$OUT_DIR/conv.ncu-rep" --page details --csv > "$OUT_DIR/conv-details.csv"
"$NCU" --import "$OUT_DIR/conv.ncu-rep" --page source --csv --print-source cuda,sass > "$OUT_DIR/conv-source.csv"
echo "ncu: $OUT_DIR/conv-details.csv, $OUT_DIR/conv-source.csv"
