"""What `engramctl bench serve` asks both servers, as a user's client would:

- one_stream: one conversation, one streamed reply; ms/token after the first, greedy and sampled;
- multi_turn: a stock client resending the whole history each turn; then both servers restart and the
  client sends one more turn (the case engramctl exists for);
- concurrent: N clients at once, each its own conversation.

Each measurement visits the servers in ABBA order (run i: A then B when i is even, B then A when odd) so a
load change on this shared machine hits both alike. Every figure carries the server's CPU time over the
wall time it took, and how many cores other processes used meanwhile (`Meter`).
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import httpx

from engramctl.bench.material import FILLER_CHARS_PER_TOKEN, filler_words, user_message
from engramctl.bench.serve.client import CHAT_SAMPLING, GREEDY, Reply, stream_chat
from engramctl.bench.serve.servers import Server
from engramctl.bench.timing import IDLE_OTHER_CORES, busy_cpu_s, median, spread

STREAM_PROMPT = "Count from 1 to 300, one number per line, and say nothing else."
SAMPLINGS = {"greedy": GREEDY, "sampled": CHAT_SAMPLING}


def abba(servers: Sequence[Server], run: int) -> list[Server]:
    return list(servers) if run % 2 == 0 else list(reversed(servers))


class Meter:
    """with Meter(servers) as m: ... then m.result: wall, each server's CPU/wall, other processes' cores."""

    def __init__(self, servers: Sequence[Server]):
        self.servers = list(servers)

    def __enter__(self) -> "Meter":
        self._t0, self._own0 = time.perf_counter(), time.process_time()
        self._busy0 = busy_cpu_s()[0]
        self._cpu0 = {s.name: s.cpu_s() for s in self.servers}
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.perf_counter() - self._t0, 1e-9)
        servers = {s.name: s.cpu_s() - self._cpu0[s.name] for s in self.servers}
        own = time.process_time() - self._own0
        others = max(0.0, busy_cpu_s()[0] - self._busy0 - own - sum(servers.values())) / wall
        self.result = {
            "wall_s": round(wall, 2),
            "cpu_per_wall": {name: round(cpu / wall, 2) for name, cpu in servers.items()},
            "client_cpu_per_wall": round(own / wall, 2),
            "other_processes_cores": round(others, 2),
            "idle": others < IDLE_OTHER_CORES,
        }


def stats(values: Sequence[float | None]) -> dict:
    """Median and [min, max] of the values measured (None: not measured), rounded as the report shows them."""
    vals = [v for v in values if v is not None]
    mid, ends = median(vals), spread(vals)
    return {"median": None if mid is None else round(mid, 3), "spread": ends and [round(x, 3) for x in ends]} | {
        "n": len(vals)
    }


def one_stream(
    client: httpx.Client, servers: Sequence[Server], runs: int, tokens: int, seed: int, extra: dict | None = None
) -> dict:
    """ms/token after the first token of one streamed reply, greedy and with chat's sampling; `extra` goes into
    both (the runner's: the end-of-generation tokens banned, so that every reply runs to `tokens` on both
    servers: sampled replies that ended after 5 tokens on one and 64 on the other measured different work)."""
    messages = [{"role": "user", "content": STREAM_PROMPT}]
    out = {}
    for mode, base in SAMPLINGS.items():
        sampling = {**base, **(extra or {})}
        for s in servers:  # warm-up, not counted: first requests allocate and fill caches
            stream_chat(client, s, messages, sampling, 8, seed)
        per: dict[str, list[Reply]] = {s.name: [] for s in servers}
        cpu: dict[str, list[float]] = {s.name: [] for s in servers}
        with Meter(servers) as meter:
            for run in range(runs):
                for s in abba(servers, run):
                    c0, t0 = s.cpu_s(), time.perf_counter()
                    per[s.name].append(stream_chat(client, s, messages, sampling, tokens, seed + run))
                    cpu[s.name].append((s.cpu_s() - c0) / (time.perf_counter() - t0))
                    s.settle(client)
        out[mode] = {
            name: {
                "ms_per_token": stats([r.ms_per_token for r in replies]),
                "ttft_ms": stats([r.ttft_s * 1000 for r in replies]),
                "tokens": stats([r.completion_tokens or len(r.chunk_times_s) for r in replies]),
                "cpu_per_wall": stats(cpu[name]),
            }
            for name, replies in per.items()
        } | {"load": meter.result}
    return out


def first_message(seed: int, label: str, chars: int = 800) -> str:
    """A ~300-token opening message (SmolLM2's tokenizer), different per `label` and `seed` so no two
    conversations share more than the template's first tokens."""
    notes = filler_words(seed, chars)
    return f"[{label}] Read these notes, then answer my questions.\n\n{notes}\n\n{user_message(0)}"


def multi_turn(
    client: httpx.Client,
    servers: Sequence[Server],
    turns: int,
    tokens: int,
    seed: int,
    opening_tokens: int | None = None,
) -> dict:
    """A stock client: every turn resends the whole history (its own server's replies included). After
    `turns` turns both servers restart and the client sends turn turns+1. `opening_tokens`: about how long the
    first message is (default ~300), so the conversation a restart resumes can be long."""
    history = {s.name: [] for s in servers}
    rows = []
    opening = (
        first_message(seed, "multi-turn")
        if opening_tokens is None
        else first_message(seed, "multi-turn", int(opening_tokens * FILLER_CHARS_PER_TOKEN))
    )

    def turn(i: int) -> None:
        user = {"role": "user", "content": opening if i == 0 else user_message(i)}
        for s in abba(servers, i):
            reply = stream_chat(client, s, history[s.name] + [user], GREEDY, tokens, seed)
            s.settle(client)
            history[s.name] += [user, {"role": "assistant", "content": reply.text}]
            rows.append(
                {
                    "turn": i + 1,
                    "server": s.name,
                    "ttft_ms": round(reply.ttft_s * 1000, 1),
                    "prompt_tokens": reply.prompt_tokens,
                    "cached_tokens": reply.cached_tokens,
                    "after_restart": i == turns,
                }
            )

    with Meter(servers) as warm:
        for i in range(turns):
            turn(i)
    for s in servers:
        s.restart()
    with Meter(servers) as cold:
        turn(turns)
    warm_ttft = {
        s.name: stats([r["ttft_ms"] for r in rows if r["server"] == s.name and 2 <= r["turn"] <= turns])
        for s in servers
    }
    restart_ttft = {r["server"]: r["ttft_ms"] for r in rows if r["after_restart"]}
    return {"turns": rows, "warm_ttft_ms": warm_ttft, "restart_ttft_ms": restart_ttft} | {
        "load": {"warm": warm.result, "after_restart": cold.result}
    }


def concurrent(
    client: httpx.Client,
    servers: Sequence[Server],
    n: int,
    tokens: int,
    seed: int,
    run: int,
    sampling: dict = GREEDY,
    rounds: int = 1,
) -> dict:
    """`n` clients at once, each its own ~300-token conversation and a `tokens`-token greedy reply, `rounds`
    times per server in ABBA order (round r counts as run `run + r`), new conversations each round (a server
    keeping states must not find one it has seen). Per server: each round's figures and their medians (the
    machine's noise moves one round's wall by 10-20%: read medians of several). The runner bans the
    end-of-generation tokens (`sampling`, stops.no_end): a reply that ended early on one server and not on the
    other (batched replies part at near-ties: docs/batching.md) would give the two different work."""
    per: dict[str, list[dict]] = {s.name: [] for s in servers}
    for r in range(rounds):
        messages = [  # the same conversations for both servers; new ones for each n and round
            [{"role": "user", "content": first_message(seed + i, f"n={n} round {r} client {i}")}] for i in range(n)
        ]
        for s in abba(servers, run + r):
            per[s.name].append(clients_at_once(client, s, messages, sampling, tokens, seed))
    return {name: _rounds_summary(rows) for name, rows in per.items()}


def clients_at_once(
    client: httpx.Client, s: Server, messages: list[list[dict]], sampling: dict, tokens: int, seed: int
) -> dict:
    """One wave: each conversation of `messages` streamed by a thread of its own, all released at once; the
    wave's wall, each reply's TTFT, the aggregate tokens/s and what the server said it reused (shared.py's
    agent waves and the concurrent workload)."""
    n = len(messages)
    replies: list[Reply | BaseException | None] = [None] * n
    barrier = threading.Barrier(n + 1)

    def one(i: int) -> None:
        barrier.wait()
        try:
            replies[i] = stream_chat(client, s, messages[i], sampling, tokens, seed)
        except BaseException as e:  # noqa: BLE001 - reported with the figures, not raised from a thread
            replies[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    with Meter([s]) as meter:
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    s.settle(client)
    errors = [repr(r) for r in replies if not isinstance(r, Reply)]
    done = [r for r in replies if isinstance(r, Reply)]
    generated = sum(r.completion_tokens or len(r.chunk_times_s) for r in done)
    return {
        "wall_s": round(wall, 2),
        "ttft_ms": [round(r.ttft_s * 1000, 1) for r in done],
        "median_ttft_ms": stats([r.ttft_s * 1000 for r in done])["median"],
        "aggregate_tok_s": round(generated / wall, 2) if wall > 0 else None,
        "tokens": generated,
        "prompt_tokens": [r.prompt_tokens for r in done],
        "cached_tokens": [r.cached_tokens for r in done],
        "errors": errors,
        "load": meter.result,
    }


def _rounds_summary(rows: list[dict]) -> dict:
    """One server's rounds: the medians (with [min, max]) of wall, aggregate tokens/s and median TTFT; every
    round's TTFTs, tokens and errors together; each round as measured."""
    return {
        "wall_s": stats([r["wall_s"] for r in rows]),
        "aggregate_tok_s": stats([r["aggregate_tok_s"] for r in rows]),
        "median_ttft_ms": stats([r["median_ttft_ms"] for r in rows]),
        "ttft_ms": [t for r in rows for t in r["ttft_ms"]],
        "tokens": [r["tokens"] for r in rows],
        "errors": [e for r in rows for e in r["errors"]],
        "rounds": rows,
    }
