"""README's and docs/performance.md's result tables are the bench files' rows: rendering
them again from docs/bench/ changes nothing."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_result_tables_match_the_bench_files():
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "results_tables.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
