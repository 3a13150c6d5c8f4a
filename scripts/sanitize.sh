#!/usr/bin/env bash
# compute-sanitizer's four tools over tests/gpu/sanitize_cases.py (package installed,
# on a GPU machine). Runs every tool; exits non-zero if any reported an error.
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
# Control first (tests/gpu/sanitize_control.py): does initcheck see TMA stores at all?
echo "=== initcheck control: PyTorch reading the stock CUTLASS kernel's TMA-stored output"
"$SANITIZER" --tool initcheck --print-limit 2 python3 tests/gpu/sanitize_control.py | tail -4 || true
failed=()
for tool in memcheck racecheck synccheck initcheck; do
  echo "=== $tool"
  # PyTorch's caching allocator hands out uninitialized blocks on purpose; initcheck
  # judges reads of memory no one wrote, which is what matters here.
  "$SANITIZER" --tool "$tool" --error-exitcode 1 --print-limit 20 python3 tests/gpu/sanitize_cases.py \
    || failed+=("$tool")
done
if ((${#failed[@]})); then
  echo "compute-sanitizer: errors from ${failed[*]}"
  exit 1
fi
echo "compute-sanitizer: memcheck, racecheck, synccheck, initcheck clean"
