#!/usr/bin/env bash
# compute-sanitizer's four tools over tests/gpu/sanitize_cases.py (package installed,
# on a GPU machine). Exits non-zero at the first tool that reports an error.
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZER="${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
for tool in memcheck racecheck initcheck synccheck; do
  echo "=== $tool"
  # PyTorch's caching allocator hands out uninitialized blocks on purpose; initcheck
  # judges reads of memory no one wrote, which is what matters here.
  "$SANITIZER" --tool "$tool" --error-exitcode 1 --print-limit 20 python3 tests/gpu/sanitize_cases.py
done
echo "compute-sanitizer: memcheck, racecheck, initcheck, synccheck clean"
