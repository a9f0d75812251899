"""`engramctl bench serve` drives the real daemon as a streaming client; without llama-server it measures
engramctl alone and says why. On the tiny GGUF: every workload answers, the turn after the restart is
served from the daemon's snapshot (cached tokens), and no target claims a verdict without a peer."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from engramctl.bench.llama_server import find_or_build, install_dir
from engramctl.bench.serve.runner import targets
from engramctl.cli import app


@pytest.fixture(scope="module")
def gguf(served_model):
    return served_model("llama.cpp")


def test_bench_serve_measures_the_daemon_alone_without_llama_server(gguf, engram_home):
    args = ["bench", "serve", "--model", str(gguf), "--runs", "1", "--stream-tokens", "32", "--turns", "3"]
    args += ["--turn-tokens", "16", "--opening-tokens", "900", "--clients", "1,5", "--client-tokens", "32"]
    args += ["--client-runs", "2", "--no-llama-server", "--json", "--threads", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["peer"]["why_not"] == "--no-llama-server was given"
    assert "measuring engramctl alone" in r.stderr
    for mode in ("greedy", "sampled"):
        ours = out["one_stream"][mode]["engramctl"]
        assert ours["ms_per_token"]["median"] > 0
        assert ours["tokens"]["spread"] == [32, 32]  # --quick's stream_tokens: end tokens banned, no reply ended early
        assert "llama-server" not in out["one_stream"][mode]
    assert out["memory"]["engramctl"]["rss_bytes"] > 50 * 2**20
    turns = out["multi_turn"]["turns"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4]
    assert [t["after_restart"] for t in turns] == [False, False, False, True]
    assert turns[0]["cached_tokens"] == 0
    assert 700 < turns[0]["prompt_tokens"] < 1200  # --opening-tokens 900 (the default opening is ~300)
    # a stock client resending its history after a restart: the daemon restores its snapshot
    assert turns[-1]["cached_tokens"] > turns[0]["prompt_tokens"]
    assert set(out["concurrent"]) == {"1", "5"}
    # 5 clients are more than the daemon's default serves at once (1 thread: 4 or fewer): it was restarted with
    # --sequences 5, as llama-server would get -np 5
    default = out["concurrent"]["1"]["engramctl"]["at_once"]
    assert 1 <= default < 5 and out["concurrent"]["5"]["engramctl"]["at_once"] == 5
    for n, by in out["concurrent"].items():
        ours = by["engramctl"]
        assert ours["errors"] == [] and len(ours["rounds"]) == 2
        assert len(ours["ttft_ms"]) == 2 * int(n)
        assert ours["tokens"] == [int(n) * 32] * 2  # --quick's client_tokens: no reply ended early
        walls = [r["wall_s"] for r in ours["rounds"]]
        assert ours["wall_s"]["spread"] == [min(walls), max(walls)] and ours["wall_s"]["n"] == 2
        # each round's conversations are new: the daemon found no more than the chat template's first tokens
        for r in ours["rounds"]:
            assert all(c < p / 2 for c, p in zip(r["cached_tokens"], r["prompt_tokens"])), r
    assert [t["met"] for t in out["targets"]] == [None] * 6  # (a) x2, (b) x2, (c) 5 clients x2: no peer


def test_targets_compare_ours_with_llama_servers():
    def stream(ours, theirs):
        return {"engramctl": {"ms_per_token": {"median": ours}}, "llama-server": {"ms_per_token": {"median": theirs}}}

    result = {
        "one_stream": {"greedy": stream(10.4, 10.0), "sampled": stream(11.0, 10.0)},
        "multi_turn": {
            "warm_ttft_ms": {"engramctl": {"median": 300.0}, "llama-server": {"median": 280.0}},
            "restart_ttft_ms": {"engramctl": 500.0, "llama-server": 2000.0},
        },
    }

    def clients(ours_agg, theirs_agg, ours_ttft, theirs_ttft):
        def one(agg, ttft):
            return {"aggregate_tok_s": {"median": agg}, "median_ttft_ms": {"median": ttft}}

        return {"engramctl": one(ours_agg, ours_ttft), "llama-server": one(theirs_agg, theirs_ttft)}

    result["concurrent"] = {"1": clients(9.0, 10.0, 50.0, 40.0), "4": clients(33.0, 30.0, 900.0, 1000.0)}
    result["concurrent"]["8"] = clients(27.0, 30.0, 1100.0, 1000.0)
    got = {t["target"]: (t["value"], t["met"]) for t in targets(result)}
    assert got == {
        "one stream, greedy: ms/token vs llama-server": (1.04, True),
        "one stream, sampled: ms/token vs llama-server": (1.1, False),
        "warm multi-turn TTFT vs llama-server": (1.071, True),
        "TTFT after a restart: llama-server / ours": (4.0, False),
        "4 clients: aggregate tok/s vs llama-server": (1.1, True),  # one client is (a)'s to judge
        "4 clients: median TTFT vs llama-server": (0.9, True),
        "8 clients: aggregate tok/s vs llama-server": (0.9, False),
        "8 clients: median TTFT vs llama-server": (1.1, False),
    }


def test_llama_server_not_built_says_why(tmp_path, monkeypatch):
    said = []
    missing = install_dir(tmp_path) / "bin" / "llama-server"
    assert find_or_build(tmp_path, said.append, build=False) == (
        None,
        f"llama-server is not built yet ({missing} is missing)",
    )
    monkeypatch.setattr("shutil.which", lambda _tool: None)
    binary, why = find_or_build(tmp_path, said.append)
    assert binary is None and "cmake, c++ not found" in why
    assert said == []  # nothing was started


def test_the_banned_end_tokens_cover_every_token_the_daemon_stops_at(gguf):
    from engramctl.bench.serve.stops import end_of_generation_ids, no_end
    from engramctl.engine.llama_backend import LlamaCppBackend

    ids = end_of_generation_ids(gguf)
    stops = LlamaCppBackend(gguf, gguf.name, threads=1).tokenizer.eos_ids
    assert stops and set(stops) <= set(ids)
    assert no_end(gguf) == {"logit_bias": {str(t): -100 for t in ids}}


def test_where_our_llama_cpp_runs_on_a_gpu_the_peer_is_built_and_run_for_the_same_card(tmp_path):
    """The CPU build here: the peer is today's CPU build, in today's cache folder. A CUDA build that found a GPU
    (stand-in architectures): CUDA for the same architectures, a folder of its own, every layer on the GPU."""
    from engramctl.bench.llama_server import SERVER_FLAGS, cmake_flags, gpu_archs
    from engramctl.bench.serve.servers import Server
    from engramctl.engine.llama_build import installed_cpu_args

    cpu = cmake_flags(())
    assert gpu_archs() == () and cpu == (*installed_cpu_args(), *SERVER_FLAGS)
    if installed_cpu_args() == ("-DGGML_NATIVE=ON",):  # setup's native build passed its smoke test here
        assert install_dir(tmp_path).name.endswith("-26ee05e4")  # the CPU build's cache folder, as before
    cuda = cmake_flags(("89-real", "90-real"))
    assert cuda[: len(cpu)] == cpu
    assert cuda[len(cpu) :] == ("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=89-real;90-real")
    assert install_dir(tmp_path, ("90-real",)) != install_dir(tmp_path)
    peer = dict(threads=2, ctx=4096, slots=4, logs=tmp_path)
    on_gpu = Server.llama_server(tmp_path / "llama-server", tmp_path / "m.gguf", gpu=True, **peer).command
    on_cpu = Server.llama_server(tmp_path / "llama-server", tmp_path / "m.gguf", **peer).command
    assert on_gpu[-2:] == ["-ngl", "999"] and "-ngl" not in on_cpu


def test_the_peer_is_built_with_the_cpu_flags_setup_chose_for_our_llama_cpp(tmp_path):
    """A VM whose AMX faults: setup's smoke test installed the no-amx build, and llama-server gets the same CPU side
    the rest of our build's args (vision objects, OpenMP) are not the peer's."""
    from engramctl.bench.llama_server import SERVER_FLAGS, cmake_flags
    from engramctl.engine.llama_build import installed_cpu_args

    mark = tmp_path / "llama-cpp-python.cmake-args"
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    mark.write_text(
        f"-DGGML_NATIVE=ON '-DCMAKE_C_FLAGS={no_amx}' '-DCMAKE_CXX_FLAGS={no_amx}' -DLLAVA_BUILD=OFF "
        "-DGGML_OPENMP=OFF\n"
        "level=no-amx\nsmoke=passed\ndied=native SIGILL -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF\n"
    )
    cpu = installed_cpu_args(mark)
    assert cpu == ("-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}")
    assert cmake_flags((), cpu) == (*cpu, *SERVER_FLAGS)
    assert installed_cpu_args(tmp_path / "none") == ("-DGGML_NATIVE=ON",)  # installed some other way: native


def test_on_a_gpu_the_peer_is_the_cpu_front_end_over_our_cuda_libraries(tmp_path, monkeypatch):
    """Where our llama.cpp is a CUDA build, llama-server is not built with CUDA again (35 min per architecture): the
    CPU build's front-end is assembled with llama-cpp-python's own CUDA libraries (file names as the real builds
    lay them out; the real pair served SmolLM2 on the development machine, docs/gpu.md)."""
    import os

    from engramctl.bench import llama_server
    from engramctl.bench.serve.servers import Server

    assert llama_server.wheel_libs() is None  # this machine's llama-cpp-python: the CPU build
    front = install_dir(tmp_path) / "bin"
    front.mkdir(parents=True)
    for name in ("llama-server", "libllama-server-impl.so", "libllama-common.so.0", "libmtmd.so.0"):
        (front / name).write_text(f"front {name}")
    for name in ("libllama.so.0", "libggml.so.0", "libggml-cpu.so.0"):
        (front / name).write_text(f"cpu {name}")
    wheel = tmp_path / "site-packages" / "llama_cpp" / "lib"
    wheel.mkdir(parents=True)
    for name in ("libllama.so.0", "libggml.so.0", "libggml-base.so.0", "libggml-cpu.so.0", "libggml-cuda.so.0"):
        (wheel / name).write_text(f"cuda {name}")
    said: list[str] = []
    binary, why = find_or_build(tmp_path, said.append, build=False, cuda_archs=("90-real",), cuda_libs=wheel)
    assert why is None and binary == install_dir(tmp_path, ("90-real",)) / "bin" / "llama-server"
    got = {p.name: p.read_text() for p in binary.parent.iterdir()}
    assert got == {
        **{
            n: f"front {n}" for n in ("llama-server", "libllama-server-impl.so", "libllama-common.so.0", "libmtmd.so.0")
        },
        **{p.name: f"cuda {p.name}" for p in wheel.iterdir()},
    }
    assert "front-end over llama-cpp-python's CUDA libraries" in said[0]
    # its libraries first, then the machine's (CUDA's runtime and cuBLAS)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/cuda/lib64")
    server = Server.llama_server(binary, tmp_path / "m.gguf", threads=2, ctx=4096, slots=4, logs=tmp_path, gpu=True)
    assert server.env["LD_LIBRARY_PATH"] == f"{binary.parent}{os.pathsep}/usr/local/cuda/lib64"
    # no CPU build to take the front-end from, and none to be built: said why
    binary, why = find_or_build(tmp_path / "empty", said.append, build=False, cuda_archs=("90-real",), cuda_libs=wheel)
    assert binary is None and "not built yet" in why


def test_other_snapshots_fill_the_store_through_its_api_before_the_daemon_starts(gguf, engram_home, tiny_engine):
    """`bench serve --other-snapshots N`: N snapshots of other sessions, of the served model (every prompt's lookup
    considers them), durable in the store the daemon then opens; none is ever a prompt's start."""
    from engramctl.bench.serve.others import OTHER_PREFIX, PER_SESSION, fill
    from engramctl.engine.gguf_header import gguf_fingerprint, read_header
    from engramctl.settings import load_settings
    from engramctl.store.store import Store
    from tests.helpers.inprocess import InProcessDaemon

    info = fill(engram_home, gguf, 23, seed=1)
    assert info["snapshots"] == 23 and info["sessions"] == -(-23 // PER_SESSION)
    with Store.open(load_settings()) as s:
        snaps = s.snapshots.list()
        assert len(snaps) == 23 and all(r.durable and r.session.startswith(OTHER_PREFIX) for r in snaps)
        assert {r.fingerprint for r in snaps} == {gguf_fingerprint(read_header(gguf))}
        assert len(s.sessions.list()) == info["sessions"]
    with InProcessDaemon(tiny_engine("llama.cpp")) as d:
        oai, h = d.clients()
        r = oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hello?"}], max_tokens=2, temperature=0
        )
        assert r.usage.prompt_tokens_details.cached_tokens == 0
        assert len(d.store.snapshots.list()) == 23 + 2  # its prompt and reply snapshots beside them
        h.close()


def test_empty_twin_takes_turns_with_the_daemon_and_each_figure_is_a_ratio_to_it(gguf, engram_home):
    """`--other-snapshots N --empty-twin`: a second daemon on an empty store serves the same waves in the same run
    (ABBA), and the targets compare the daemon holding the others' snapshots with it."""
    from engramctl.bench.serve.runner import EMPTY_TWIN

    args = ["bench", "serve", "--model", str(gguf), "--workloads", "agents", "--agent-clients", "2"]
    args += ["--system-tokens", "64", "--other-snapshots", "6", "--empty-twin", "--no-llama-server", "--json"]
    r = CliRunner().invoke(app, args + ["--threads", "1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    agents = out["agents"]["2"]
    assert set(agents) == {"engramctl", EMPTY_TWIN}
    for name in agents:
        assert [len(agents[name][w]["ttft_ms"]) for w in ("wave1", "wave2", "wave3")] == [2, 2, 2]
        assert agents[name]["wave1"]["errors"] == []
    twin = {t["target"]: t for t in out["targets"] if "others' snapshots / empty store" in t["target"]}
    assert sorted(twin) == [
        "2 agents, wave1 wall_s: 6 others' snapshots / empty store",
        "2 agents, wave2 median_ttft_ms: 6 others' snapshots / empty store",
        "2 agents, wave3 median_ttft_ms: 6 others' snapshots / empty store",
    ]
    wall = agents["engramctl"]["wave1"]["wall_s"] / agents[EMPTY_TWIN]["wave1"]["wall_s"]
    assert twin["2 agents, wave1 wall_s: 6 others' snapshots / empty store"]["value"] == round(wall, 3)


def test_empty_twin_without_other_snapshots_is_a_usage_error(engram_home):
    r = CliRunner().invoke(app, ["bench", "serve", "--empty-twin", "--no-llama-server"])
    assert r.exit_code == 2 and "--empty-twin" in r.stderr and "Hint:" in r.stderr


def test_others_targets_sum_the_long_conversations_turns():
    from engramctl.bench.serve.runner import EMPTY_TWIN

    turns = [{"engramctl": {"ttft_ms": a}, EMPTY_TWIN: {"ttft_ms": b}} for a, b in ((1200.0, 1000.0), (900.0, 1000.0))]
    result = {"other_snapshots": {"snapshots": 5000}, "long": {"turns": turns}}
    got = {t["target"]: (t["value"], t["met"]) for t in targets(result)}
    assert got["long conversation, TTFT of 2 turns: 5000 others' snapshots / empty store"] == (1.05, True)
    turns[1]["engramctl"]["ttft_ms"] = 1100.0  # 2,300 / 2,000
    got = {t["target"]: (t["value"], t["met"]) for t in targets(result)}
    assert got["long conversation, TTFT of 2 turns: 5000 others' snapshots / empty store"] == (1.15, False)
