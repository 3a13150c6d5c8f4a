#!/usr/bin/env bash
# Build, test and measure on a machine with a Hopper GPU, in one go (docs/device.md):
#   1. install any wheels in .whl/ (for machines without network access: e.g. the
#      nvidia-cutlass wheel) into /tmp/site,
#   2. build and install cutlassfuse against the machine's torch (incremental: the
#      ignored build/ folder is reused), or install the wheel of the same sources carried
#      in .wheels/ (each build leaves its wheel in $OUT/wheels/),
#   3. the selected steps (STEPS, default all, in this order):
#        tests      the GPU tests (pytest -m gpu tests/gpu, or GPU_TESTS's selection), then
#                   every other test against this build (pytest tests --ignore=tests/gpu,
#                   in parallel: the invalid-call matrix runs a process per case)
#        demo       the KernelBench level2/61 demo
#        breakdown  per-kernel times and launch counts, every benchmark shape (bench.DEFAULT_SHAPES)
#        compare    (only when named) per-kernel times of this build against the source tree in
#                   the tarball BASELINE (e.g. `git archive main -o base.tar`), every benchmark
#                   shape, alternating rounds (benchmarks/compare_breakdowns.py)
#        baselines  benchmarks/fused_vs_baselines.py (kb61, kb61_v0; the three tile
#                   configurations of the ping-pong kernel)
#        configs    benchmarks/variant_choice.py clusters (128x128 ping-pong tiles in
#                   clusters of 1 and 2, alternating rounds; the cluster rule's data)
#        taps       benchmarks/variant_choice.py border-taps (every tap vs the taps
#                   reaching each tile, alternating rounds)
#        schedule   benchmarks/variant_choice.py tile-schedule (static tile walk vs
#                   tiles drawn from a counter, alternating rounds)
#        host       benchmarks/host_overhead.py (host vs device time per call)
#        spread     benchmarks/call_spread.py (per-call percentiles, eager vs CUDA graph replay)
#        float32    benchmarks/float32_choice.py (accuracy and time of the fp32 choices)
#        streams    benchmarks/phase_streams.py (sub-pixel phases on 1-8 streams)
#        training   benchmarks/training_step.py
#        gradients  benchmarks/conv_gradient_choice.py (the backward's convolution gradients,
#                   CUTLASS against cuDNN per layer: the conv_gradients rule's data)
#        gradmode   benchmarks/grad_mode.py (eager and cutlassfuse in grad mode against no_grad,
#                   every benchmark shape, dtype, float32 mode and the fallback; CSV)
#        blocks     benchmarks/blocks.py --train, fp16 and bf16 (the block family's modules on real networks'
#                   blocks against eager, torch.compile and cuDNN's conv + one copy; CSV)
#        networks   benchmarks/networks.py --train (MONAI's UNet, BasicUNet, DynUNet and SegResNet
#                   through cutlassfuse.fuse against eager and torch.compile, fp16 and bf16, NCDHW;
#                   output and gradient errors against float64; needs MONAI's wheel in .whl/; CSV)
#        video      benchmarks/video_vae.py (diffusers' HunyuanVideo decoder through fuse against eager,
#                   fp16 and bf16, then Mochi's, CogVideoX's and Wan's, fp16, CogVideoX's also on 13 latent frames (six
#                   frame batches); needs diffusers' wheel in .whl/), then benchmarks/memory_bound_ops.py
#                   (the replicate pad, nearest upsampling, bias add, upsampled modulation and channel RMS
#                   norm against ATen's, fp16)
#        kernelbench benchmarks/kernelbench_harness.py (level2/61 judged by KernelBench's own
#                   evaluation method: correctness trials, grad-mode timing; fp32, fp16, bf16)
#        examples   examples/*.py
#        bench      python -m cutlassfuse bench (CSV, JSON, PNG)
#        cli        every bench and profile option once on the GPU (small shapes)
#        profile    python -m cutlassfuse profile (Nsight Compute table, fp16, of each
#                   shape in PROFILE_SHAPES, default kb61)
#        sanitize   scripts/sanitize.sh (only when named, or CUTLASSFUSE_SANITIZE=1)
#        stalls     scripts/ncu_conv_source.sh (only when named: per-line stalls of the conv)
#      e.g. STEPS="tests breakdown" bash scripts/device_iteration.sh
#   4. a short summary last.
# Results go to $OUT (default /tmp/cutlassfuse-device): the bench CLI's CSV, JSON and
# PNG, grad_mode.py's, blocks.py's and networks.py's CSV, the GPU tests' JUnit XML, and one archive of every log
# (logs.tar.gz).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/cutlassfuse-device}"
LOGS="$(mktemp -d)"
mkdir -p "$OUT"
# Archived at every step, so a run stopped at the call's time limit still returns its logs.
archive_logs() { tar czf "$OUT/logs.tar.gz" -C "$LOGS" . 2>/dev/null; }
trap archive_logs EXIT
export PYTHONUNBUFFERED=1 CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)"
PYTHON="${PYTHON:-python3}"
STEPS="${STEPS:-all}"
[[ "${CUTLASSFUSE_SANITIZE:-0}" == 1 ]] && STEPS="$STEPS sanitize"

step() { archive_logs; printf '\n=== %s (%s s)\n' "$*" "$SECONDS"; }
wanted() { [[ " $STEPS " == *" $1 "* || ( " $STEPS " == *" all "* && "$1" != sanitize && "$1" != stalls && "$1" != compare ) ]]; }
status=()

step "environment"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$LOGS/gpu.txt"
"$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

step "install carried wheels"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "no wheels in .whl/ (docs/device.md)"; exit 1; }
export PYTHONPATH=/tmp/site

step "build"
if wanted compare; then
  # The baseline builds beside this tree's build.
  rm -rf /tmp/baseline-src /tmp/baseline && mkdir -p /tmp/baseline-src && tar xf "${BASELINE:?BASELINE: a tarball of the baseline source tree}" -C /tmp/baseline-src
  (cd /tmp/baseline-src && "$PYTHON" -m pip install --no-build-isolation --no-deps --no-index --target /tmp/baseline \
     -C cmake.define.CUTLASSFUSE_BASELINE_KERNELS=ON . \
     >"$LOGS/baseline-build.log" 2>&1) &
  baseline_build=$!
fi
# The compiled extension is keyed by every file its build reads besides the Python
# package: a wheel of the same key in .wheels/<key>/ (carried from an earlier run) installs
# in seconds, with this tree's Python files copied over its own; otherwise the build's
# wheel goes to $OUT/wheels/<key>/, to carry into the next run as .wheels/.
build_key() {
  find cpp pyproject.toml requirements-build.txt -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}
install_wheel() {
  "$PYTHON" -m pip install -q --no-deps --no-index --force-reinstall "$1" >>"$LOGS/build.log" 2>&1
}
start=$(date +%s)
key="$(build_key)"
cached="$(ls .wheels/"$key"/cutlassfuse-*.whl 2>/dev/null | head -1)"
if [[ -n "$cached" ]] && install_wheel "$cached"; then
  package="$("$PYTHON" -c 'import importlib.util as u; print(u.find_spec("cutlassfuse").submodule_search_locations[0])')"
  cp -r python/cutlassfuse/. "$package"/
  status+=("build: wheel $key carried, installed in $(( $(date +%s) - start )) s")
elif "$PYTHON" -m pip wheel --no-build-isolation --no-deps --no-index -v -w "$OUT/wheels/$key" \
     -C cmake.define.CUTLASSFUSE_BASELINE_KERNELS=ON . >"$LOGS/build.log" 2>&1 \
   && install_wheel "$(ls "$OUT/wheels/$key"/cutlassfuse-*.whl | head -1)"; then
  status+=("build: ok in $(( $(date +%s) - start )) s (wheel $key in \$OUT/wheels)")
else
  tail -50 "$LOGS/build.log"; echo "build failed"; exit 1
fi
grep -E "registers|spill" "$LOGS/build.log" | sort | uniq -c | head -20
# The benchmark shapes' names (cutlassfuse.bench.DEFAULT_SHAPES).
BENCH_SHAPES="$("$PYTHON" -c 'from cutlassfuse.bench import DEFAULT_SHAPES; print(*(s.name for s in DEFAULT_SHAPES))')"

if wanted tests; then
  step "GPU tests"
  # A hung kernel must not eat the whole call: the remaining steps still run.
  # shellcheck disable=SC2086  # GPU_TESTS: pytest's selection, e.g. "tests/gpu/test_fused_shapes.py -k drawn"
  timeout 420 "$PYTHON" -m pytest -m gpu ${GPU_TESTS:-tests/gpu} -q -rf -p no:cacheprovider --durations=10 --junitxml="$OUT/gpu-tests.xml" 2>&1 \
    | tee "$LOGS/gpu-tests.log"
  status+=("gpu tests: $(tail -1 "$LOGS/gpu-tests.log")")
  if [[ -z "${GPU_TESTS:-}" ]]; then
    # -rf: the failed tests' names in the summary; one worker per core keeps the suite under the timeout.
    timeout 420 "$PYTHON" -m pytest tests --ignore=tests/gpu -n "$(nproc)" -q -rf -p no:cacheprovider 2>&1 \
      | tee "$LOGS/other-tests.log"
    status+=("other tests: $(tail -1 "$LOGS/other-tests.log")")
  fi
fi

if wanted demo; then
  step "demo (KernelBench level2/61)"
  "$PYTHON" -m cutlassfuse demo 2>&1 | tee "$LOGS/demo.log"
fi

if wanted breakdown; then
  step "kernel breakdown"
  for shape in $BENCH_SHAPES; do
    "$PYTHON" benchmarks/kernel_breakdown.py --shape "$shape"
  done 2>&1 | tee "$LOGS/breakdown.log"
  "$PYTHON" benchmarks/kernel_breakdown.py --shape kb61 --dtype float32 2>&1 | tee -a "$LOGS/breakdown.log"
fi

if wanted compare; then
  step "per-kernel times against the baseline build"
  wait "$baseline_build" || { tail -30 "$LOGS/baseline-build.log"; echo "baseline build failed"; exit 1; }
  breakdowns() {  # $1: source tree whose benchmarks/kernel_breakdown.py runs
    for shape in $BENCH_SHAPES; do
      "$PYTHON" "$1/benchmarks/kernel_breakdown.py" --shape "$shape"
    done
  }
  for round in 1 2 3; do
    PYTHONPATH=/tmp/baseline:/tmp/site breakdowns /tmp/baseline-src >"$LOGS/compare-before-$round.log" 2>&1
    breakdowns . >"$LOGS/compare-after-$round.log" 2>&1
  done
  "$PYTHON" benchmarks/compare_breakdowns.py --before "$LOGS"/compare-before-*.log --after "$LOGS"/compare-after-*.log \
    2>&1 | tee "$LOGS/compare.log"
  status+=("compare: $(tail -1 "$LOGS/compare.log")")
fi

if wanted baselines; then
  step "benchmark: fused vs baselines, the three tile configurations"
  "$PYTHON" benchmarks/fused_vs_baselines.py --no-compile 2>&1 | tee "$LOGS/bench.log"
fi

if wanted configs; then
  step "ping-pong 128x128 tiles in clusters of 1 and 2"
  { "$PYTHON" benchmarks/variant_choice.py clusters --graph --shape kb61 --shape kb61_v0 --shape unet_k2s2 --shape gan_k4s2p1 \
      --shape vid_k3s2p1op1 --shape 4,128,256,24,24,24,3,1,0,0,16 --shape 2,256,128,48,48,48,3,1,1,0,8 \
      --shape 16,64,256,16,16,16,3,1,0,0,8 --shape 8,64,192,24,24,24,3,1,0,0,8 --shape 4,128,512,16,16,16,3,1,1,0,32 \
      --shape 2,64,256,8,8,8,3,1,0,0,8
    "$PYTHON" benchmarks/variant_choice.py clusters --graph --shape kb61 --dtype bfloat16; } 2>&1 | tee "$LOGS/configs.log"
fi

if wanted taps; then
  step "border taps: every K block vs the taps reaching each tile"
  { "$PYTHON" benchmarks/variant_choice.py border-taps --shape kb61 --shape kb61_v0 --shape gan_k4s2p1 \
      --shape vid_k3s2p1op1 --shape 2,256,128,48,48,48,3,1,1,0,8 --shape 4,128,256,24,24,24,3,1,0,0,16 \
      --shape 16,64,128,16,16,16,5,1,0,0,8 --shape 8,64,64,12,12,12,3,1,1,0,8
    "$PYTHON" benchmarks/variant_choice.py border-taps --shape kb61 --shape kb61_v0 --dtype bfloat16; } 2>&1 |
    tee "$LOGS/taps.log"
fi

if wanted schedule; then
  step "tile schedule: static walk vs tiles drawn as CTAs reach them"
  { "$PYTHON" benchmarks/variant_choice.py tile-schedule --graph --shape kb61 --shape kb61_v0 --shape gan_k4s2p1 \
      --shape vid_k3s2p1op1 --shape unet_k2s2 --shape 2,256,128,48,48,48,3,1,1,0,8 \
      --shape 16,64,128,16,16,16,5,1,0,0,8 --shape 8,64,64,12,12,12,3,1,1,0,8
    "$PYTHON" benchmarks/variant_choice.py tile-schedule --graph --shape kb61 --shape kb61_v0 --dtype bfloat16; } 2>&1 |
    tee "$LOGS/schedule.log"
fi

if wanted host; then
  step "host cost per call"
  "$PYTHON" benchmarks/host_overhead.py --table kb61_v0 --grad-mode 2>&1 | tee "$LOGS/host.log"
fi

if wanted spread; then
  step "per-call spread, eager calls vs CUDA graph replay"
  for shape in vid_k3s2p1op1 unet_k2s2; do
    "$PYTHON" benchmarks/call_spread.py --shape "$shape"
  done 2>&1 | tee "$LOGS/spread.log"
fi

if wanted float32; then
  step "float32: accuracy and time of the choices"
  for shape in kb61 gan_k4s2p1; do
    "$PYTHON" benchmarks/float32_choice.py --shape "$shape"
  done 2>&1 | tee "$LOGS/float32.log"
fi

if wanted streams; then
  step "sub-pixel phases on side streams"
  "$PYTHON" benchmarks/phase_streams.py 2>&1 | tee "$LOGS/streams.log"
fi

if wanted training; then
  step "training step: time and memory"
  "$PYTHON" benchmarks/training_step.py 2>&1 | tee "$LOGS/training.log"
fi

if wanted gradients; then
  step "convolution gradients: CUTLASS against cuDNN"
  "$PYTHON" benchmarks/conv_gradient_choice.py 2>&1 | tee "$LOGS/gradients.log"
fi

if wanted gradmode; then
  step "grad mode against no_grad"
  "$PYTHON" benchmarks/grad_mode.py --csv "$OUT/grad-mode.csv" 2>&1 | tee "$LOGS/gradmode.log"
fi

if wanted blocks; then
  step "the block family on real networks' blocks"
  "$PYTHON" benchmarks/blocks.py --dtypes float16,bfloat16 --train --csv "$OUT/blocks.csv" 2>&1 | tee "$LOGS/blocks.log"
fi

if wanted networks; then
  step "MONAI's networks through cutlassfuse.fuse"
  "$PYTHON" benchmarks/networks.py --dtypes float16,bfloat16 --memory-formats ncdhw --train --csv "$OUT/networks.csv" \
    2>&1 | tee "$LOGS/networks.log"
fi

if wanted video; then
  step "diffusers' HunyuanVideo decoder through cutlassfuse.fuse; the memory-bound ops alone"
  { "$PYTHON" benchmarks/video_vae.py
    "$PYTHON" benchmarks/video_vae.py --vae mochi --dtypes float16
    "$PYTHON" benchmarks/video_vae.py --vae cogvideox --dtypes float16
    "$PYTHON" benchmarks/video_vae.py --vae cogvideox --dtypes float16 --latent 13,32,32 --rounds 3
    "$PYTHON" benchmarks/video_vae.py --vae wan --dtypes float16
    "$PYTHON" benchmarks/memory_bound_ops.py --dtypes float16; } 2>&1 | tee "$LOGS/video.log"
fi

if wanted kernelbench; then
  step "KernelBench's evaluation of level2/61"
  "$PYTHON" benchmarks/kernelbench_harness.py 2>&1 | tee "$LOGS/kernelbench.log"
fi

if wanted examples; then
  step "examples"
  for example in examples/*.py; do
    echo "--- $example"; "$PYTHON" "$example" 2>&1 | tail -8
  done | tee "$LOGS/examples.log"
fi

if wanted bench; then
  step "bench CLI (all benchmark shapes)"
  "$PYTHON" -m cutlassfuse bench --csv "$OUT/bench.csv" --json "$OUT/bench.json" --plot "$OUT/speedups.png" \
    2>&1 | tee "$LOGS/bench-cli.log"
fi

if wanted cli; then
  step "bench and profile options"
  { "$PYTHON" -m cutlassfuse bench --shapes kb61_v0,vid_k3s2p1op1 --dtypes float16,bfloat16,float32 \
      --memory-formats ncdhw,channels_last --no-compile --repeats 5 \
      && "$PYTHON" -m cutlassfuse bench --shapes "2,32,64,8,8,8,3,2,1,1,8;1,16,32,6,6,6,2,2,0,0,4" --repeats 5 \
      && "$PYTHON" -m cutlassfuse bench --shapes kb61_v0 --dtypes float32 --tiny --repeats 5 \
      && "$PYTHON" -m cutlassfuse profile --shape kb61_v0 --dtype float32 --memory-format channels_last \
      && "$PYTHON" -m cutlassfuse profile --shape unet_k2s2 --dtype bfloat16 \
      && echo "cli: every option ran"; } 2>&1 | tee "$LOGS/cli.log"
  status+=("$(grep -E "^cli: " "$LOGS/cli.log" || echo "cli: FAILED")")
fi

if wanted profile; then
  for shape in ${PROFILE_SHAPES:-kb61}; do
    step "Nsight Compute ($shape fp16)"
    "$PYTHON" -m cutlassfuse profile --shape "$shape" --dtype float16 --csv "$LOGS/ncu-$shape.csv" 2>&1 \
      | tee "$LOGS/ncu-$shape.log"
  done
fi

if wanted sanitize; then
  step "compute-sanitizer"
  bash scripts/sanitize.sh 2>&1 | tee "$LOGS/sanitize.log"
  status+=("sanitizer: $(tail -1 "$LOGS/sanitize.log")")
fi

if wanted stalls; then
  step "Nsight Compute source view of the conv kernel"
  bash scripts/ncu_conv_source.sh "$LOGS" 2>&1 | tail -5
  rm -f "$LOGS/conv.ncu-rep"
fi

step "summary"
show() { [[ -f "$LOGS/$1" ]] && { shift; "$@"; }; }
cat "$LOGS/gpu.txt"
printf '%s\n' "${status[@]}"
show demo.log sed -n '/^dtype/,$p' "$LOGS/demo.log"
show bench.log grep -E "^kb61|fused\(CL in\)" "$LOGS/bench.log"
show breakdown.log grep -E "launches per call|: fused_sm90|: fallback|: reference" "$LOGS/breakdown.log"
show configs.log cat "$LOGS/configs.log"
show taps.log cat "$LOGS/taps.log"
show schedule.log cat "$LOGS/schedule.log"
show host.log head -7 "$LOGS/host.log"
show float32.log cat "$LOGS/float32.log"
show streams.log cat "$LOGS/streams.log"
show bench-cli.log grep -E "^\[|cutlassfuse  |cutlassfuse fallback|grad mode" "$LOGS/bench-cli.log"
show training.log cat "$LOGS/training.log"
show gradients.log cat "$LOGS/gradients.log"
show gradmode.log cat "$LOGS/gradmode.log"
show blocks.log cat "$LOGS/blocks.log"
show networks.log cat "$LOGS/networks.log"
show kernelbench.log cat "$LOGS/kernelbench.log"
true
