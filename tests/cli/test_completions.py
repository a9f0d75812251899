"""completions/* are generated from the app; fail on drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_completion_files_match_the_app():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_completions
    finally:
        sys.path.pop(0)
    generated = gen_completions.generate()
    assert set(generated) == {"engramctl.bash", "_engramctl", "engramctl.fish"}
    for name, text in generated.items():
        path = ROOT / "completions" / name
        assert path.is_file(), f"{path} missing; run python scripts/gen_completions.py"
        assert path.read_text() == text, f"{path} is out of date; run python scripts/gen_completions.py"
    assert "_ENGRAMCTL_COMPLETE=complete_bash" in generated["engramctl.bash"]
    assert generated["_engramctl"].startswith("#compdef engramctl\n")


def test_bash_script_is_valid_and_completes(tmp_path):
    script = ROOT / "completions" / "engramctl.bash"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_callbacks_read_the_index(seeded):
    from engramctl.cli import complete

    assert complete.complete_session("d") == ["demo"]
    assert set(complete.complete_session("")) == {"demo", "other"}
    assert complete.complete_snapshot(seeded.prefix(seeded.all_ids[0])) == [seeded.all_ids[0]]
    assert complete.complete_snapshot("zz") == []
    assert "demo" in complete.complete_session_or_snapshot("")


def test_callbacks_without_an_index(engram_home):
    from engramctl.cli import complete

    assert complete.complete_session("") == [] and complete.complete_snapshot("") == []
