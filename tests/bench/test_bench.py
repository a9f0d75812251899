"""`engramctl bench`: the JSON schema, and that --quick completes. Timings are never asserted (the
machine is shared); structure, token counts and exactness are.

The command is driven through Typer's CliRunner on an app built here from the command function,
so these tests do not depend on how the root app registers it.
"""

from __future__ import annotations

import json
import sys

import pytest
import typer
from typer.testing import CliRunner

from engramctl.cli.bench import bench
from engramctl.cli.common import EngramGroup


def make_app() -> typer.Typer:
    app = typer.Typer(cls=EngramGroup, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.command("bench")(bench)

    @app.callback()
    def _root() -> None:
        """Test root."""

    return app


def invoke(args: list[str], home) -> object:
    env = {"ENGRAM_HOME": str(home), "HF_HUB_OFFLINE": "1", "ENGRAM_NO_AUTOSTART": "1"}
    return CliRunner().invoke(make_app(), ["bench", *args], env=env, catch_exceptions=False)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One `engramctl bench --quick --json` run shared by the schema tests."""
    home = tmp_path_factory.mktemp("bench-home")
    result = invoke(["--quick", "--json"], home)
    return result, home


@pytest.fixture(scope="module")
def report(quick) -> dict:
    result, _ = quick
    assert result.exit_code == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout)


NUM = (int, float)


def test_quick_completes_with_one_json_object_and_cleans_up(quick):
    result, home = quick
    assert result.exit_code == 0, result.stderr
    obj = json.loads(result.stdout)  # exactly one JSON document on stdout
    assert isinstance(obj, dict)
    assert "Traceback" not in result.stderr
    data_dir = home  # ENGRAM_HOME is the data dir
    assert not list(data_dir.glob("bench-*")), "the bench's temporary store was left behind"


def test_top_level_schema(report):
    for key in (
        "schema",
        "created",
        "command",
        "mode",
        "machine",
        "model",
        "settings",
        "tiers",
        "bandwidth",
        "contexts",
        "multiturn",
        "save",
        "targets",
    ):
        assert key in report, key
    assert report["schema"] == "engramctl-bench/1"
    assert report["mode"] == "in-process"
    assert report["command"].startswith("engramctl bench --preset tiny --quick")
    m = report["machine"]
    for key in ("cpu", "cpu_cores", "cpu_threads", "ram_total_bytes", "gpu", "torch", "transformers", "torch_threads"):
        assert key in m, key
    for when in ("load_before", "load_after"):
        assert isinstance(m[when]["idle"], bool) and isinstance(m[when]["other_processes_cores"], NUM)
    mo = report["model"]
    assert mo["source"] == "preset" and mo["preset"] == "tiny"
    assert mo["family"] == "granitemoehybrid" and mo["dtype"] == "float32"
    assert mo["layers"] == {"attention": 1, "recurrent": 3}
    assert set(report["tiers"]) == {"vram", "ram", "disk"}
    assert all(isinstance(t["budget_bytes"], int) and t["rule"] for t in report["tiers"].values())
    s = report["settings"]
    assert (s["runs"], s["warmup_runs"], s["seed"], s["quick"]) == (2, 1, 0, True)


def test_bandwidth_schema(report):
    bw = report["bandwidth"]
    assert isinstance(bw["memcpy_bytes_per_s"], int) and bw["memcpy_bytes_per_s"] > 0
    assert isinstance(bw["disk_read_bytes_per_s"], int) and bw["disk_read_bytes_per_s"] > 0
    assert bw["disk_read"]["evicted"] in (True, False)


def test_contexts_schema(report):
    rows = report["contexts"]
    assert [r["tokens"] for r in rows] == [256, 1024]
    required = (
        "tokens",
        "prefill_ms",
        "restore_ram_ms",
        "restore_disk_ms",
        "ttft_restored_ms",
        "ttft_prefill_ms",
        "snapshot_bytes",
        "restore_disk_efficiency",
    )
    for r in rows:
        for key in required:
            assert isinstance(r[key], NUM), (key, r[key])
        assert r["runs"] == 2 and r["message_tokens"] == 32
        assert r["restored_from"] == {"ram": "ram", "disk": "disk"}
        for key in ("prefill", "restore_ram", "restore_disk", "ttft_prefill", "ttft_restored"):
            lo, hi = r["spread_ms"][key]
            assert lo <= hi
            assert isinstance(r["cpu_per_wall"][key], NUM)
        # exactness, not speed: continuing from a restored snapshot gives the re-prefill's logits
        assert r["max_abs_logit_diff"] <= 1e-4
    # a hybrid's snapshot = constant + attention K/V per token: it grows with the context
    assert rows[1]["snapshot_bytes"] > rows[0]["snapshot_bytes"]
    # the cold restore reads the snapshot's file and its 128-token KV blocks, each evicted first
    assert rows[0]["disk_cold"]["files"] == 1 + 256 // 128 and rows[1]["disk_cold"]["files"] == 1 + 1024 // 128


def test_multiturn_schema(report):
    mt = report["multiturn"]
    assert mt["turns"] == 10 and len(mt["per_turn"]) == 10
    comp = mt["prompt_tokens_computed"]
    assert comp["stateful"] < comp["stateless"]
    assert comp["stateless"] == mt["prompt_tokens_sent"]
    assert mt["token_reduction"] == pytest.approx(1 - comp["stateful"] / comp["stateless"], abs=1e-4)
    assert mt["resets"] == 0  # the preset's ChatML template is prefix-stable
    first = mt["per_turn"][0]
    assert first["computed_stateful"] == first["computed_stateless"] == first["prompt_tokens"]
    assert all(p["restored_from"] == "ram" for p in mt["per_turn"][1:])
    for side in ("stateful", "stateless"):
        for key in ("time_per_turn_ms", "ttft_ms", "total_s"):
            assert isinstance(mt[side][key], NUM)


def test_save_schema(report):
    s = report["save"]
    assert s["snapshots"] == 20 and s["turns"] == 10
    for key in ("settle_ms", "capture_ms", "commit_ms", "write_ms", "stream_close_ms", "snapshot_bytes"):
        assert isinstance(s[key], NUM), key
    assert s["after_last_token"] is True  # saving never starts before the last token
    assert isinstance(s["overlapped"], bool)


def test_targets_are_reported_not_asserted(report):
    t = report["targets"]
    assert set(t) == {"restore_speedup_at_1024", "restore_disk_efficiency", "token_reduction"}
    assert all(isinstance(v["met"], bool) for v in t.values())


def test_speed_on_transformers_measures_engramctl_and_says_why_no_reference(report):
    sp = report["speed"]
    assert (sp["prefill_tokens"], sp["decode_tokens"]) == (128, 16)
    assert sp["engramctl"]["backend"] == "transformers" and isinstance(sp["engramctl"]["decode_ms_per_token"], NUM)
    assert sp["raw_llama_cpp"] is None and "llama.cpp backend only" in sp["raw_skipped"]
    assert sp["transformers"] is None and sp["transformers_skipped"]
    assert set(sp["ratios"].values()) == {None}
    mo = report["model"]
    assert (mo["backend"], mo["weight_type"], mo["resident_weight_bytes"]) == (
        "transformers",
        "float32",
        mo["weights_bytes"],
    )


def test_structured_output_cost_per_constrained_token(report):
    c = report["constrained"]
    assert c["valid_reply_accepted"] is True  # the model's own tokenization of a valid reply passes the mask
    assert c["vocab"] == 512 and c["runs"] == report["settings"]["runs"] and c["tokens"] > 20
    for key in ("tokenizer_build_ms", "schema_compile_ms", "per_token_us", "per_token_p95_us", "per_token_max_us"):
        assert isinstance(c[key], NUM) and c[key] > 0, key
    assert c["per_token_us"] <= c["per_token_p95_us"] <= c["per_token_max_us"]


def test_text_report_renders_every_section(report):
    from engramctl.cli.bench_report import render

    text = render(report)
    for title in (
        "BANDWIDTH FLOOR",
        "CONTEXT SWEEP",
        "SPEED",
        "MULTI-TURN CHAT",
        "STRUCTURED OUTPUT",
        "SNAPSHOT SAVES",
        "TARGETS",
    ):
        assert title in text
    assert "preset:tiny@seed0" in text


def test_plot_draws_a_png(report, tmp_path):
    pytest.importorskip("matplotlib")
    from engramctl.cli.bench_plot import plot

    out = tmp_path / "bench.png"
    plot(report, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_usage_error_with_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = invoke(["--quick", "--plot", str(tmp_path / "x.png")], tmp_path)
    assert result.exit_code == 2
    assert "matplotlib" in result.stderr and "pip install" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "x", "--preset", "tiny"], "cannot be combined"),
        (["--contexts", "12,abc"], "comma-separated"),
        (["--preset", "nope"], "unknown preset"),
    ],
)
def test_usage_errors(tmp_path, args, words):
    result = invoke(args, tmp_path)
    assert result.exit_code == 2
    assert words in result.stderr.lower()


def test_multiturn_stateful_side_records_what_the_daemon_records(engram_home):
    """The stateful side runs the daemon's own service (its turn, its restore, its recorder), so the store
    ends up as a daemon's would: the transcript, and per turn a prompt and a reply snapshot in one chain."""
    from engramctl.bench.preset_dir import preset_dir
    from engramctl.bench.runner import StoreBox
    from engramctl.engine.loading import load_engine
    from engramctl.bench.workloads import multiturn
    from engramctl.settings import load_settings

    settings = load_settings({})
    settings.paths.ensure()
    box = StoreBox(settings)
    try:
        model_dir = preset_dir("tiny", 0, settings.paths.cache_dir)
        engine = load_engine(str(model_dir), settings.paths.cache_dir, "cpu", "float32", backend="transformers")
        rows = multiturn.run(engine, box, 3, 4)["rows"]
        store, session = box.store, multiturn.SESSION
        messages = store.transcripts.of_session(session)
        assert [m["role"] for m in messages] == ["user", "assistant"] * 3
        ids = [r["stateful"]["_save"]["ids"] for r in rows]
        assert all(len(pair) == 2 for pair in ids) and store.sessions.get(session).head == ids[-1][1]
        assert [store.snapshots.info(reply).parent for _, reply in ids] == [prompt for prompt, _ in ids]
        assert [store.snapshots.info(prompt).parent for prompt, _ in ids[1:]] == [reply for _, reply in ids[:-1]]
        assert [store.snapshots.info(reply).n_tokens for _, reply in ids] == [
            r["stateful"]["prompt_tokens"] + r["stateful"]["reply_tokens"] for r in rows
        ]
        later = [r["stateful"] for r in rows[1:]]
        assert all(s["restored_from"] == "ram" and s["computed_tokens"] < s["prompt_tokens"] for s in later)
    finally:
        box.close()
