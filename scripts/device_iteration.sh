#!/usr/bin/env bash
# One whole GPU iteration on the device machine (see docs/device.md):
#   1. install the carried nvidia-cutlass wheel (.whl/; the machine has no network),
#   2. build and install cutlassfuse against the machine's torch (incremental: the
#      ignored build/ folder survives between calls on a warm machine),
#   3. run the GPU tests, 4. run the KernelBench demo and benchmarks (and, with
#   CUTLASSFUSE_SANITIZE=1, compute-sanitizer), 5. print a short table last.
# The device tool brings back at most 8 files from $OUT: the bench CLI's CSV, JSON and
# PNG, the GPU tests' JUnit XML, and one archive of every log (logs.tar.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/cutlassfuse-device}"
LOGS="$(mktemp -d)"
mkdir -p "$OUT"
trap 'tar czf "$OUT/logs.tar.gz" -C "$LOGS" .' EXIT
export PYTHONUNBUFFERED=1 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
PYTHON="${PYTHON:-python3}"

step() { printf '\n=== %s\n' "$*"; }
status=()

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOGS/gpu.txt"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "install carried wheels"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "carry .whl (docs/device.md)"; exit 1; }
export PYTHONPATH=/tmp/site

step "build"
start=$(date +%s)
if "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index -v . >"$LOGS/build.log" 2>&1; then
  status+=("build: ok in $(( $(date +%s) - start )) s")
else
  tail -50 "$LOGS/build.log"; echo "build failed"; exit 1
fi
grep -E "registers|spill" "$LOGS/build.log" | sort | uniq -c | head -20

step "GPU tests"
"$PYTHON" -m pytest -m gpu tests/gpu -q -p no:cacheprovider --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$LOGS/gpu-tests.log"
status+=("gpu tests: $(tail -1 "$LOGS/gpu-tests.log")")

step "demo (KernelBench level2/61)"
"$PYTHON" -m cutlassfuse demo 2>&1 | tee "$LOGS/demo.log"

step "kernel breakdown"
for shape in kb61 kb61_v0 unet_k2s2 gan_k4s2p1 vid_k3s2p1op1; do
  "$PYTHON" benchmarks/kernel_breakdown.py --shape "$shape"
done 2>&1 | tee "$LOGS/breakdown.log"
"$PYTHON" benchmarks/kernel_breakdown.py --shape kb61 --dtype float32 2>&1 | tee -a "$LOGS/breakdown.log"

step "benchmark: fused vs baselines, tile configurations"
"$PYTHON" benchmarks/fused_vs_baselines.py --no-compile 2>&1 | tee "$LOGS/bench.log"

step "float32: accuracy and time of the choices"
for shape in kb61 gan_k4s2p1; do
  "$PYTHON" benchmarks/float32_choice.py --shape "$shape"
done 2>&1 | tee "$LOGS/float32.log"

step "training step: time and memory"
"$PYTHON" benchmarks/training_step.py 2>&1 | tee "$LOGS/training.log"

step "examples"
for example in examples/*.py; do
  echo "--- $example"; "$PYTHON" "$example" 2>&1 | tail -8
done | tee "$LOGS/examples.log"

step "bench CLI (all baselines.md shapes)"
"$PYTHON" -m cutlassfuse bench --csv "$OUT/bench.csv" --json "$OUT/bench.json" --plot "$OUT/speedups.png" \
  2>&1 | tee "$LOGS/bench-cli.log"

step "Nsight Compute (kb61 fp16)"
"$PYTHON" -m cutlassfuse profile --shape kb61 --dtype float16 2>&1 | tee "$LOGS/ncu.log"

if [[ "${CUTLASSFUSE_SANITIZE:-0}" == 1 ]]; then
  step "compute-sanitizer"
  bash scripts/sanitize.sh 2>&1 | tee "$LOGS/sanitize.log"
  status+=("sanitizer: $(tail -1 "$LOGS/sanitize.log")")
fi

step "summary"
cat "$LOGS/gpu.txt"
printf '%s\n' "${status[@]}"
sed -n '/^dtype/,$p' "$LOGS/demo.log"
grep -E "^kb61|fused\(CL in\)" "$LOGS/bench.log"
grep -E "launches per call|: fused_sm90|: fallback|: reference" "$LOGS/breakdown.log"
cat "$LOGS/float32.log"
grep -E "^\[|cutlassfuse  " "$LOGS/bench-cli.log"
cat "$LOGS/training.log"
