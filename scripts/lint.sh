#!/usr/bin/env bash
# Style checks, run by CI before the tests (README's test command): ruff over the
# Python (pyproject.toml's [tool.ruff]) and clang-format over the C++/CUDA
# (.clang-format). Both tools are pinned in requirements-test.txt so that a
# formatter release cannot turn CI red on unchanged code. `--fix` rewrites in place.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t cpp_files < <(git ls-files 'cpp/*.cpp' 'cpp/*.cu' 'cpp/*.h' 'cpp/*.cuh')
if [[ "${1:-}" == --fix ]]; then
  ruff check --fix .
  clang-format -i "${cpp_files[@]}"
else
  ruff check .
  clang-format --dry-run --Werror "${cpp_files[@]}"
fi
