"""The formatter configured in pyproject.toml ([tool.ruff]) has been applied: `ruff format --check` passes
and no line is longer than the configured 120 characters (ruff does not split long strings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE_LIMIT = 120


def _python_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.split()]


def test_ruff_format_is_applied():
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, f"run `.venv/bin/ruff format .`:\n{proc.stdout}{proc.stderr}"


def test_no_line_over_the_limit():
    long = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _python_files()
        if p.exists()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if len(line) > LINE_LIMIT
    ]
    assert not long, long
