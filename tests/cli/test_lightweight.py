"""`engramctl --help` and shell completion must not import torch (they run on every Tab press)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, atexit
HEAVY = ("torch", "transformers", "safetensors", "numpy", "httpx", "fastapi", "uvicorn")
atexit.register(lambda: sys.__stderr__.write("\\nHEAVY=" + ",".join(
    m for m in HEAVY if m in sys.modules) + "\\n"))
from engramctl.cli import main
sys.argv = ["engramctl"] + sys.argv[1:]
main()
"""


def run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=60
    )


def heavy(proc: subprocess.CompletedProcess) -> list[str]:
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("HEAVY=")][-1]
    return [m for m in line[len("HEAVY=") :].split(",") if m]


def test_help_imports_nothing_heavy():
    for args in (["--help"], ["snapshots", "--help"], ["chat", "--help"], ["daemon", "--help"], ["--version"]):
        proc = run(args)
        assert proc.returncode == 0, proc.stderr
        assert heavy(proc) == [], (args, heavy(proc))
    assert "Exit codes: 0 ok, 1 error, 2 usage error, 3 daemon unreachable" in run(["--help"]).stdout


def test_completion_imports_no_torch_and_lists_sessions(tmp_path):
    from tests.cli.conftest import seed_store

    seeded = seed_store({"alpha": 1, "beta": 2})
    proc = run(
        [], env={"_ENGRAMCTL_COMPLETE": "complete_bash", "COMP_WORDS": "engramctl chat --session ", "COMP_CWORD": "3"}
    )
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == {"alpha", "beta"}
    assert heavy(proc) == []
    proc = run(
        [], env={"_ENGRAMCTL_COMPLETE": "complete_bash", "COMP_WORDS": "engramctl snapshots info 0", "COMP_CWORD": "3"}
    )
    assert set(proc.stdout.split()) == set(seeded.all_ids)
    assert "torch" not in heavy(proc)


OTHER_GROUPS = """
atexit.register(lambda: sys.__stderr__.write("\\nGROUPS=" + ",".join(sorted(
    m for m in sys.modules if m.split(".")[:3] in [["engramctl", "cli", g] for g in OTHERS])) + "\\n"))
"""


def test_snapshots_ls_imports_its_group_alone():
    """A command line that names a group builds that group only: `snapshots ls` reads the index without torch
    and without the other groups' modules."""
    from tests.cli.conftest import seed_store

    seeded = seed_store({"alpha": 2})
    others = ("bench", "chat", "daemon", "models", "status", "mcp")
    probe = PROBE.replace(
        "from engramctl.cli import main", f"OTHERS = {others!r}{OTHER_GROUPS}from engramctl.cli import main"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, "snapshots", "ls", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == seeded.all_ids
    assert heavy(proc) == []
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("GROUPS=")] == ["GROUPS="]
    full = subprocess.run(
        [sys.executable, "-c", probe, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert [ln for ln in full.stderr.splitlines() if ln.startswith("GROUPS=")] != ["GROUPS="]  # the probe sees them
