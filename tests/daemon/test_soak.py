"""Soak (issue 12, item 5), bounded: 160 turns over 20+ sessions in one daemon process (tiny model,
transformers backend) with restores from RAM and disk (small RAM tier), branches and deletes. Resident
memory, open fds and threads stay flat after warm-up, disk use stays within its budget, p99 turn latency
does not drift. scripts/soak.py is the long form (>= 1,000 turns)."""

from __future__ import annotations

import random

from tests.daemon import harness

DISK_BUDGET = 16 * 10**6  # harness.SOAK_ARGS' --tier-disk-bytes 16MB


def test_soak_stays_flat(model_dir, tmp_path):
    d = harness.start(model_dir, tmp_path / "home", *harness.SOAK_ARGS)
    try:
        r = harness.soak(d, random.Random(5), turns=160, sessions=20, samples=8, say=print)
        with d.http() as h:
            status = h.get("/v1/status").json()
    finally:
        d.stop()
    print({k: v for k, v in r.items() if k != "figures"})
    assert r["restore_tiers"].get("disk", 0) > 0 and r["restore_tiers"].get("ram", 0) > 0, r["restore_tiers"]
    assert r["rss_growth"] <= 0.05, r["rss_mb"]
    assert r["fds"][1] <= r["fds"][0] * 1.05 and r["threads"][1] <= r["threads"][0] * 1.05, (r["fds"], r["threads"])
    assert r["disk_max"] <= DISK_BUDGET * 1.05  # the budget counts snapshot files; a few KB of slack for temp files
    assert r["p99_ms_q4"] <= 2.5 * r["p99_ms_q2"], (r["p99_ms_q2"], r["p99_ms_q4"])  # 2 shared cores: noisy
    assert status["write_errors"] == [] and "Traceback" not in d.log_text()


# -- four clients at once on the llama.cpp backend (issue 19) --------------------------------------------------
CLIENTS, SESSIONS_EACH = 4, 3  # 12 conversations over 4 sequences: parked, kept and restored all the time
GENERATION_TURNS = 12  # a client's sessions are new ones every 12 turns, so no conversation passes 4 turns
WARM_TURNS, TURNS = 6, 42  # per client: warm-up, then in all


def _client_turns(d, k: int, first: int, last: int, failures: list) -> None:
    import openai

    client = openai.OpenAI(base_url=d.url + "/v1", api_key=d.token, max_retries=0, timeout=120)
    try:
        for t in range(first, last):
            stream = client.chat.completions.create(
                model="default",
                messages=[{"role": "user", "content": f"Client {k}, turn {t}: what about {t * 7 % 13}?"}],
                max_tokens=4 + t % 5,
                temperature=0 if t % 2 else 0.8,
                stream=True,
                extra_body={"session": f"soak4-{k}-{t % SESSIONS_EACH}-{t // GENERATION_TURNS}"},
            )
            finish = [c.choices[0].finish_reason for c in stream if c.choices and c.choices[0].finish_reason]
            if finish[-1:] not in (["stop"], ["length"]):
                failures.append((k, t, finish))
    except BaseException as e:  # noqa: BLE001 - reported by the test
        failures.append((k, "error", repr(e)))
    finally:
        client.close()


def _round(d, first: int, last: int) -> None:
    import threading

    failures: list = []
    threads = [threading.Thread(target=_client_turns, args=(d, k, first, last, failures)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not failures, failures[:3]


def test_four_concurrent_streaming_clients_on_llama_cpp_stay_flat(served_model, tmp_path):
    """4 official openai clients stream 42 turns each at once (12 sessions over the 4 sequences: parking,
    kept states and restores from the RAM and disk tiers every few turns). Each client moves on to 3 new sessions
    every 12 turns so that the workload is the same at every sample: conversations that grow make every state
    parked, kept and restored bigger (14-turn ones grew resident memory by ~0.8 MiB per 24 turns, most of it
    the parked sequences' blobs by tracemalloc, and a clean-clone CI run went past the 2 MiB bound below; with
    the sessions renewed, 186 turns each levelled off at +5.6 MiB by turn 110). After a warm-up of 6 turns each
    (the RAM tier filled to its budget, the worker's, writer's and uvicorn's threads and the clients'
    connections made), the daemon's resident memory, threads and open fds are sampled every 6 turns each
    and must stay flat:
    - threads and fds: as many at every sample as after the warm-up (their counts change only by a leak;
      each is the fewest of 5 reads, since the writer holds a snapshot file open for a moment);
    - resident memory: under 8 MiB of growth in all, and at most 2 MiB over the last 72 turns (turns 24-42
      of each client). A state leaked per turn (the tiny model's blob is ~54 KB) adds ~3.8 MiB there. The
      allocator and caches settle but step now and then (measured over 480 turns: ~1.3 MiB per 120 turns
      late, one step of 1.1 MiB), so a slower leak is not told apart here: safetensors' ctypes cache
      (~23 KB a turn, found by a longer run of this workload) has its own test, tests/store/test_encode_no_growth.py.
    The daemon runs llama.cpp on one thread: on 2 shared cores its spinning threads would only slow the run."""
    gguf = served_model("llama.cpp")
    d = harness.start(
        gguf,
        tmp_path / "home",
        "--backend",
        "llama.cpp",
        "--sequences",
        str(CLIENTS),
        "--threads",
        "1",
        *harness.SOAK_ARGS,
    )
    try:
        with d.http() as h:
            assert h.get("/v1/status").json()["serving"]["at_once"] == CLIENTS
        _round(d, 0, WARM_TURNS)
        figures = [harness.process_figures(d.pid)]
        for first in range(WARM_TURNS, TURNS, 6):
            _round(d, first, first + 6)
            figures.append(harness.process_figures(d.pid))
        with d.http() as h:
            status = h.get("/v1/status").json()
            tiers = h.get("/v1/tiers").json()
    finally:
        d.stop()
    mib = [round(f["rss"] / 2**20, 2) for f in figures]
    print({"rss_mib": mib, "fds": [f["fds"] for f in figures], "threads": [f["threads"] for f in figures]})
    assert status["turns"] == CLIENTS * TURNS and status["write_errors"] == []
    assert [f["threads"] for f in figures] == [figures[0]["threads"]] * len(figures)
    assert [f["fds"] for f in figures] == [figures[0]["fds"]] * len(figures)
    assert len(mib) == 7 and mib[-1] - mib[0] < 8 and mib[-1] - mib[3] <= 2.0, mib
    assert sum(t["snapshots"] for t in tiers["tiers"] if t["name"] != "vram") > 0
    assert "Traceback" not in d.log_text()
