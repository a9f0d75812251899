"""`engramctl bench ngram`: a tiny run through CliRunner (and scripts/ngram_standin.py's). The report's
structure, and that the Engram output with the table on disk (read at the layer, C, or prefetched, D)
equals it resident in RAM (B) bitwise. Timings are never asserted (the machine is shared)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from engramctl.cli.bench import app as bench_app
from engramctl.cli.common import EngramGroup

ROOT = Path(__file__).resolve().parents[2]
SHARED = [  # the harness's options, the same for `engramctl bench ngram` and scripts/ngram_standin.py
    "--json", "--runs", "1", "--batch", "2", "--prefill-tokens", "8", "--chunk", "4", "--decode-tokens", "3",
    "--table-bytes", "1MiB", "--sizes", "1MiB,2MiB", "--corpus-tokens", "400", "--io-threads", "2", "--threads", "1",
]  # fmt: skip


def _engine(tmp_path, env) -> str:
    app = typer.Typer(cls=EngramGroup, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.add_typer(bench_app, name="bench")

    @app.callback()
    def _root() -> None:
        """Test root."""

    result = CliRunner().invoke(app, ["bench", "ngram", "--quick", *SHARED], env=env, catch_exceptions=False)
    assert result.exit_code == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def _stand_in(capsys, monkeypatch) -> str:
    spec = importlib.util.spec_from_file_location("ngram_standin", ROOT / "scripts" / "ngram_standin.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ngram_standin", script)  # its dataclass looks its module up
    spec.loader.exec_module(script)
    capsys.readouterr()
    assert script.main(["--hidden", "32", "--layers", "3", *SHARED]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("backbone", ["engine", "stand-in"])
def test_tiny_ngram_bench_reports_every_variant_and_c_d_equal_b(tmp_path, backbone, monkeypatch, capsys):
    """`engramctl bench ngram --quick` serves the tiny preset on the engine; scripts/ngram_standin.py runs the
    same harness on its stand-in backbone."""
    env = {"ENGRAM_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "ENGRAM_NO_AUTOSTART": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    stdout = _engine(tmp_path, env) if backbone == "engine" else _stand_in(capsys, monkeypatch)
    r = json.loads(stdout)
    assert r["schema"] == "engramctl-bench-ngram/1"
    assert r["command"].startswith("engramctl bench ngram" if backbone == "engine" else "scripts/ngram_standin.py")
    assert r["backbone"].startswith(backbone) and r["config"]["preset"] == (None if backbone == "stand-in" else "tiny")
    assert set(r["variants"]) == {"A", "B", "C", "D"}
    for v in r["variants"].values():
        assert v["tokens_per_s"] > 0 and v["prefill_tokens_per_s"] > 0 and v["decode_tokens_per_s"] > 0
        assert v["n"] == 1 and v["cpu_per_wall"] is not None
    assert r["variants"]["B"]["slowdown_vs_a"] is not None and r["variants"]["D"]["slowdown_vs_b"] is not None
    assert r["exact"] == {"c_equals_b": True, "d_equals_b": True}
    assert r["table"]["rows_per_token"] == 16 and r["table"]["size_bytes"] > 0
    assert [s["requested_bytes"] for s in r["sizes"]] == [1 << 20, 2 << 20]
    assert all(s.get("tokens_per_s") or s.get("skipped") for s in r["sizes"])
    f = r["real_text"]
    assert f["corpus"]["tokens"] == 400 and f["unique_rows_per_step"]["decode_mean"] <= 32
    assert [e["cache_rows"] for e in f["lru"]] == sorted(e["cache_rows"] for e in f["lru"])
    assert set(f["lru"][0]["hit_rate_per_order"]) == {"2", "3"}
    assert set(r["targets"]) >= {"d_within_1.05x_of_b", "c_clearly_worse_than_d", "d_flat_across_sizes"}
    assert not list(tmp_path.glob("bench-ngram-*")), "the bench's tables were left behind"
