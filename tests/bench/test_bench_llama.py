"""`engramctl bench --backend llama.cpp`: the tiny preset converted to GGUF runs end to end, the report
names the backend, the weight type and the resident weight bytes, and carries the raw llama-cpp-python
reference's figures, the ratios to it and the targets. `engramctl bench backends` (the same preset on
transformers and on llama.cpp, one device, one table) runs here too, on the GGUF this module's bench
converted. Timings are never asserted (the machine is
shared); what was measured and how it is reported is.
"""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from tests.bench.test_bench import NUM, invoke

SMALL = [
    "--contexts",
    "64",
    "--turns",
    "2",
    "--runs",
    "1",
    "--reply-tokens",
    "4",
    "--prefill-tokens",
    "32",
    "--decode-tokens",
    "4",
]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory):
    from tests.gguf_factory import needs_llama_cpp

    reason = needs_llama_cpp()
    if reason:
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("bench-llama-home")
    result = invoke(["--quick", "--backend", "llama.cpp", "--json", *SMALL], home)
    assert result.exit_code == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout), result.stderr, home


def test_the_preset_is_converted_once_and_said_on_stderr(llama_run):
    from engramctl.bench.gguf_presets import preset_gguf

    report, stderr, home = llama_run
    assert "converting preset tiny" in stderr and "GGUF F16" in stderr
    said: list[str] = []
    path = preset_gguf("tiny", 0, "f16", home / "cache", said.append)  # the bench's cache: no second conversion
    assert said == [] and str(path) == report["model"]["gguf"]


def test_header_names_backend_weight_type_and_resident_bytes(llama_run):
    from engramctl.cli.bench_report import render

    report, _, _ = llama_run
    mo = report["model"]
    assert mo["backend"] == "llama.cpp" and mo["weight_type"] == "F16" and mo["family"] == "granitehybrid"
    assert mo["source"] == "preset" and mo["preset"] == "tiny" and mo["threads"] >= 1
    assert isinstance(mo["weights_bytes"], int) and mo["weights_bytes"] > 0
    # memory-mapped: after the warm-up the file's pages are resident (smaps rounds to whole pages)
    assert mo["resident_weight_bytes"] >= mo["weights_bytes"] * 0.9
    assert report["machine"]["llama_cpp_python"]
    assert report["command"].startswith("engramctl bench --preset tiny --quick --backend llama.cpp --gguf-type f16")
    text = render(report)
    assert "BACKEND   llama.cpp" in text and "WEIGHTS   F16" in text and "raw llama.cpp (same GGUF)" in text


def test_speed_has_the_raw_reference_and_the_ratios(llama_run):
    report, _, _ = llama_run
    sp = report["speed"]
    assert (sp["prefill_tokens"], sp["decode_tokens"]) == (32, 4)
    for who in ("engramctl", "raw_llama_cpp", "transformers"):
        for key in ("prefill_ms", "decode_ms_per_token", "prefill_cpu_per_wall", "decode_cpu_per_wall"):
            assert isinstance(sp[who][key], NUM), (who, key)
    assert sp["engramctl"]["backend"] == "llama.cpp" and sp["transformers"]["backend"] == "transformers"
    raw = sp["raw_llama_cpp"]["settings"]
    assert raw["n_batch"] == raw["n_ubatch"] and raw["threads"] == report["model"]["threads"]
    r = sp["ratios"]
    # ratios are reported to 3 decimals: within 5e-4 of the figures' own ratio, whatever its size
    assert r["decode_vs_raw_llama_cpp"] == pytest.approx(
        sp["engramctl"]["decode_ms_per_token"] / sp["raw_llama_cpp"]["decode_ms_per_token"], rel=1e-2, abs=5e-4
    )
    assert r["prefill_vs_raw_llama_cpp"] == pytest.approx(
        sp["engramctl"]["prefill_ms"] / sp["raw_llama_cpp"]["prefill_ms"], rel=1e-2, abs=5e-4
    )
    assert isinstance(r["decode_speedup_vs_transformers"], NUM)
    t = report["targets"]
    for name, bound in (
        ("decode_vs_raw_llama_cpp", 1.10),
        ("prefill_vs_raw_llama_cpp", 1.05),
        ("decode_speedup_vs_transformers", 4.0),
    ):
        assert t[name]["target"] == bound and t[name]["measured"] == r[name] and isinstance(t[name]["met"], bool)


def test_the_sweep_and_the_stateful_chat_ran_on_llama_cpp(llama_run):
    report, _, _ = llama_run
    (row,) = report["contexts"]
    assert row["tokens"] == 64 and row["max_abs_logit_diff"] == 0.0  # restores are bitwise exact on llama.cpp
    mt = report["multiturn"]
    assert mt["turns"] == 2 and mt["per_turn"][1]["restored_from"] == "ram"  # the daemon's service restored it
    assert mt["prompt_tokens_computed"]["stateful"] < mt["prompt_tokens_computed"]["stateless"]
    assert report["save"]["snapshots"] == 4


def test_restore_target_is_bytes_over_memcpy_at_2048():
    from engramctl.bench.targets import targets

    row = {
        "tokens": 2048,
        "restore_ram_ms": 3.0,
        "state_bytes": 20_000_000,
        "restore_disk_efficiency": None,
        "speedup_restore_ram": None,
    }
    t = targets([row], None, None, {"memcpy_bytes_per_s": 10_000_000_000})["restore_ram_vs_memcpy_at_2048"]
    assert t["floor_ms"] == 2.0 and t["measured"] == 1.5 and t["met"] is False


@pytest.mark.parametrize(
    "args, words",
    [
        (["--model", "x.gguf", "--gguf-type", "q8_0"], "keeps its own weight type"),
        (["--backend", "transformers", "--gguf-type", "f16"], "cannot be combined"),
        (["--gguf-type", "q4"], "unknown gguf weight type"),
        (["--backend", "vulkan"], "backend"),
    ],
)
def test_usage_errors(tmp_path, args, words):
    result = invoke(args, tmp_path)
    assert result.exit_code == 2, result.stderr
    assert words in result.stderr.lower()


# -- `engramctl bench backends` -----------------------------------------------------------------------

BACKENDS_ARGS = ["--preset", "tiny", "--device", "cpu", "--prefill-tokens", "24", "--decode-tokens", "3", "--runs", "1"]
BACKENDS_ARGS += ["--threads", "1"]  # llama.cpp's spinning thread pool on a shared 2-core machine: one thread, no waits


@pytest.fixture(scope="module")
def run(llama_run):
    """`bench backends` in llama_run's home, whose cache holds the tiny preset and its F16 GGUF already."""
    from engramctl.cli.bench import app as bench_app
    from engramctl.cli.common import EngramGroup

    app = typer.Typer(cls=EngramGroup, pretty_exceptions_enable=False, rich_markup_mode=None)
    app.add_typer(bench_app, name="bench")
    home = llama_run[2]
    env = {"ENGRAM_HOME": str(home), "HF_HUB_OFFLINE": "1", "ENGRAM_NO_AUTOSTART": "1"}
    result = CliRunner().invoke(app, ["bench", "backends", *BACKENDS_ARGS, "--json"], env=env, catch_exceptions=False)
    assert result.exit_code == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return json.loads(result.stdout)


def test_bench_backends_runs_the_same_preset_on_both_backends_and_one_device(run):
    from tests.backends import expected_build

    assert run["schema"] == "engramctl-bench-backends/1"
    s = run["settings"]
    assert (s["preset"], s["device"], s["prefill_tokens"], s["decode_tokens"], s["runs"]) == ("tiny", "cpu", 24, 3, 1)
    tf, ll = run["backends"]
    assert (tf["backend"], ll["backend"]) == ("transformers", "llama.cpp") and run["skipped"] == {}
    assert tf["device"] == ll["device"] == run["machine"]["device"] == "cpu"
    assert (tf["weight_type"], ll["weight_type"]) == ("float32", "F16")
    # the build each engine reports, and on transformers the recurrent layers' path (engine/hf_kernels.py)
    assert tf["build"] == expected_build("transformers") and ll["build"] == expected_build("llama.cpp")
    assert tf["kernels"] == tf["build"].split("recurrent layers: ")[1] and ll["kernels"] is None
    assert tf["torch_threads"] == 1  # --threads reaches torch too
    for row in (tf, ll):
        assert row["runs"] == 1 and row["decode_steps"] == 3
        for key in ("prefill_ms", "prefill_tokens_per_s", "decode_ms_per_token"):
            assert isinstance(row[key], NUM) and row[key] > 0, (row["backend"], key)
    r = run["ratios"]
    assert r["decode_llama_cpp_speedup"] == round(tf["decode_ms_per_token"] / ll["decode_ms_per_token"], 3)
    assert run["command"] == "engramctl bench backends --preset tiny --gguf-type f16 " + (
        "--prefill-tokens 24 --decode-tokens 3 --runs 1 --seed 0 --threads 1 --device cpu"
    )


def test_bench_backends_table_puts_both_rows_and_builds_side_by_side(run):
    from engramctl.cli.bench_backends import render

    text = render(run).splitlines()
    assert text[0].startswith("SAME MODEL  preset tiny (seed 0) on cpu: 24-token prefill")
    header = next(i for i, ln in enumerate(text) if ln.startswith("BACKEND"))
    assert text[header].split() == ["BACKEND", "DEVICE", "WEIGHTS", "PREFILL", "TOK/S", "PREFILL", "DECODE", "MS/TOKEN"]
    assert text[header + 1].split()[:3] == ["transformers", "cpu", "float32"]
    assert text[header + 2].split()[:3] == ["llama.cpp", "cpu", "F16"]
    assert any(ln.startswith("transformers  build torch ") and "PyTorch fallback" in ln for ln in text)
    assert any(ln.startswith("llama.cpp     build CPU (") for ln in text)
    assert any(ln.startswith("llama.cpp vs transformers: prefill ") for ln in text)
    assert text[-1] == f"command: {run['command']}"
