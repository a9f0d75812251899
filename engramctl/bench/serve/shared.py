"""The `engramctl bench serve` workloads of state shared between conversations (issue 37):

- agents: N clients at once, each a new conversation opening with the same long system prompt and its own
  question; a second wave of N new conversations with that system prompt; both servers restart; a third wave.
  Wave 1 shows the shared prefix computed once (not N times), wave 2 its reuse, wave 3 what survives a restart.
- long_conversation: one stock client resending its whole history, each turn adding a long message, to the
  context's end; per turn, the TTFT on both servers and what the daemon wrote (its process's write_bytes and
  its data directory's size), against what a turn must write at least: the new tokens' KV and the state's
  constant part (recurrent state, logits, metadata), both read from the daemon's own snapshot sizes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import httpx

from engramctl.bench.material import FILLER_CHARS_PER_TOKEN, filler_words, user_message
from engramctl.bench.serve.client import GREEDY, stream_chat
from engramctl.bench.serve.others import OTHER_PREFIX
from engramctl.bench.serve.servers import Server
from engramctl.bench.serve.workloads import Meter, abba, clients_at_once, stats


def system_prompt(seed: int, tokens: int) -> str:
    """An agent's long system prompt: instructions, then ~`tokens` tokens of reference notes."""
    notes = filler_words(seed + 7919, int(tokens * FILLER_CHARS_PER_TOKEN))
    return (
        "You are a travel-planning assistant for a small agency. Answer in at most three sentences, "
        "using the agency's notes below when they help.\n\nNotes:\n" + notes
    )


def _wave(seed: int, wave: int, n: int, system: str) -> list[list[dict]]:
    """n new conversations: the shared system prompt, each its own question (never seen before)."""
    return [
        [
            {"role": "system", "content": system},
            {"role": "user", "content": f"(wave {wave}, client {i}) {user_message(wave * n + i)}"},
        ]
        for i in range(n)
    ]


def agents(
    client: httpx.Client,
    servers: Sequence[Server],
    n: int,
    system_tokens: int,
    tokens: int,
    seed: int,
    sampling: dict = GREEDY,
) -> dict:
    """Three waves of `n` new conversations sharing a system prompt; both servers restart before the third.
    Per server and wave: wall, median TTFT, each client's prompt and cached tokens (servers' own usage)."""
    system = system_prompt(seed, system_tokens)
    per: dict[str, dict] = {s.name: {} for s in servers}
    for wave in (1, 2, 3):
        if wave == 3:
            for s in servers:
                s.restart()
        convs = _wave(seed, wave, n, system)
        for s in abba(servers, wave):
            per[s.name][f"wave{wave}"] = clients_at_once(client, s, convs, sampling, tokens, seed)
    return per


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _snapshot_sizes(client: httpx.Client, daemon: Server) -> list[tuple[int, int]]:
    """(tokens, whole size in bytes: its own file and every KV block it uses) of every snapshot the daemon keeps
    but the other sessions' a --other-snapshots run put there first (others.py)."""
    body = client.get(daemon.url + "/list_snapshots", headers=daemon.headers).json()
    return [
        (int(s.get("tokens") or 0), int(s.get("bytes") or 0))
        for s in body.get("snapshots", [])
        if not str(s.get("session") or "").startswith(OTHER_PREFIX)
    ]


def state_cost(sizes: list[tuple[int, int]]) -> tuple[float, float] | None:
    """(constant bytes, KV bytes per token) of the model's state, from snapshots of different lengths: a
    snapshot's whole size is the constant part plus the KV of its tokens (DESIGN.md invariant 2)."""
    pts = sorted(set(sizes))
    if len(pts) < 2 or pts[0][0] == pts[-1][0]:
        return None
    (n0, b0), (n1, b1) = pts[0], pts[-1]
    per_token = (b1 - b0) / (n1 - n0)
    return b0 - per_token * n0, per_token


def long_conversation(
    client: httpx.Client,
    servers: Sequence[Server],
    daemon_data: Path,
    context_tokens: int,
    turn_tokens: int,
    reply_tokens: int,
    seed: int,
    max_turns: int | None = None,
    others_bytes: int = 0,
) -> dict:
    """A stock client resending its history, each turn a ~`turn_tokens`-token message, while the next turn
    fits `context_tokens` (with room for the message's tokens to run 20% over), `max_turns` turns at most. Per
    turn: TTFT per server, the daemon's bytes written and data dir size (less `others_bytes`: other sessions'
    snapshots put there before the daemon started)."""
    history: dict[str, list[dict]] = {s.name: [] for s in servers}
    daemon = next(s for s in servers if s.name == "engramctl")
    rows = []
    prompt_tokens = 0
    turn = 0
    with Meter(servers) as meter:
        while prompt_tokens + int(1.2 * turn_tokens) + 2 * reply_tokens < context_tokens and (
            max_turns is None or turn < max_turns
        ):
            notes = filler_words(seed + 31 * turn, int(turn_tokens * FILLER_CHARS_PER_TOKEN))
            user = {"role": "user", "content": f"{user_message(turn)}\n\nMore notes:\n{notes}"}
            row: dict = {"turn": turn + 1}
            for s in abba(servers, turn):
                s.settle(client)
                written0 = daemon.written_bytes()
                reply = stream_chat(client, s, history[s.name] + [user], GREEDY, reply_tokens, seed)
                s.settle(client)
                history[s.name] += [user, {"role": "assistant", "content": reply.text}]
                row[s.name] = {
                    "ttft_ms": round(reply.ttft_s * 1000, 1),
                    "prompt_tokens": reply.prompt_tokens,
                    "cached_tokens": reply.cached_tokens,
                }
                if s is daemon:
                    row["written_bytes"] = daemon.written_bytes() - written0
                    row["data_dir_bytes"] = dir_bytes(daemon_data) - others_bytes
                    prompt_tokens = reply.prompt_tokens or prompt_tokens
                    row["new_tokens"] = (reply.prompt_tokens or 0) - (reply.cached_tokens or 0) + reply_tokens
            rows.append(row)
            turn += 1
        sizes = _snapshot_sizes(client, daemon)
        prefixes = client.get(daemon.url + "/v1/tiers", headers=daemon.headers).json().get("prefix_states") or {}
    cost = state_cost(sizes)
    kept = len(sizes) + int(prefixes.get("count") or 0)
    figures = _written_vs_floor(rows, sizes, cost, kept)
    return {"turns": rows, "load": meter.result, "prefix_states": prefixes} | figures


def _written_vs_floor(
    rows: list[dict], sizes: list[tuple[int, int]], cost: tuple[float, float] | None, kept: int
) -> dict:
    """Each turn's bytes written over its floor (its new tokens' KV + two snapshots' constant parts: the prompt
    snapshot and the reply snapshot), and the data dir over (the KV once + the constant part of each of the `kept`
    states: snapshots and prefix states)."""
    if cost is None:
        return {"state_cost": None}
    constant, per_token = cost
    for r in rows:
        floor = r["new_tokens"] * per_token + 2 * constant
        r["written_ratio"] = round(r["written_bytes"] / floor, 3) if floor > 0 else None
    longest = max(n for n, _ in sizes)
    floor_dir = longest * per_token + kept * constant
    last = rows[-1]["data_dir_bytes"] if rows else 0
    return {
        "state_cost": {"constant_bytes": round(constant), "kv_bytes_per_token": round(per_token, 1)},
        "written_ratio": stats([r["written_ratio"] for r in rows[1:]]),  # turn 1 also writes the model's prefix
        "data_dir_ratio": round(last / floor_dir, 3) if floor_dir > 0 else None,
        "kept_snapshots": len(sizes),
        "kept_states": kept,
    }
