"""Snapshot saves of the stateful chat, against the stream.

The daemon's rule: nothing heavy happens between the last token and the end of the stream, and the
disk write never delays a token. Per turn we know when the last token was sampled, when the save
started (settle + capture + commit run after it) and when each snapshot became durable (the store's
writer thread). Reported:

- settle_ms: feeding the last sampled token into the state (one decode step), so the snapshot holds
  the whole reply; it runs after the last token and the finish chunk were sent, but before the stream's
  trailing chunk (the recorded turn's snapshot id);
- capture_ms: copying the reply state out of the cache (on the request thread, after the last token);
- commit_ms: Store.commit of the prompt and the reply snapshot (RAM tier insert + queueing the write);
- write_ms: commit -> durable on disk (encode, checksum, write, fsync, rename: the writer thread);
- stream_close_ms: last token -> the turn's bookkeeping done (settle, capture, commits);
- after_last_token: every save started after that turn's last token (so it cannot have delayed it);
- overlapped: the disk writes ran in the background (they finished after the turn had returned);
- durable_before_next_turn: turns whose snapshots were on disk before the next turn started.
"""

from __future__ import annotations

from typing import Any

from engramctl.bench.timing import median, spread


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    saves = [r["stateful"]["_save"] for r in rows]
    if not saves:
        return {"snapshots": 0}
    write_ms, sizes, overlapped, before_next = [], [], 0, 0
    for i, s in enumerate(saves):
        for sid_at, size in zip(s["durable_at"], s["bytes"]):
            if sid_at is not None:
                write_ms.append((sid_at - s["t_commit"]) * 1000)
                overlapped += sid_at > s["t_turn_end"]
            if size is not None:
                sizes.append(size)
        nxt = saves[i + 1]["t_turn_start"] if i + 1 < len(saves) else None
        last = max((t for t in s["durable_at"] if t is not None), default=None)
        if nxt is not None and last is not None and last <= nxt:
            before_next += 1

    def r3(v):
        return None if v is None else round(v, 3)

    settle = [s["settle_ms"] for s in saves]
    capture = [s["capture_ms"] for s in saves]
    commit = [s["commit_ms"] for s in saves]
    close = [(s["t_turn_end"] - s["t_last_token"]) * 1000 for s in saves]
    return {
        "snapshots": 2 * len(saves),
        "snapshot_bytes": r3(median(sizes)),
        "settle_ms": r3(median(settle)),
        "capture_ms": r3(median(capture)),
        "commit_ms": r3(median(commit)),
        "write_ms": r3(median(write_ms)),
        "stream_close_ms": r3(median(close)),
        "spread_ms": {
            "settle": [r3(x) for x in spread(settle) or []],
            "capture": [r3(x) for x in spread(capture) or []],
            "commit": [r3(x) for x in spread(commit) or []],
            "write": [r3(x) for x in spread(write_ms) or []],
            "stream_close": [r3(x) for x in spread(close) or []],
        },
        "after_last_token": all(s["t_save_start"] >= s["t_last_token"] for s in saves),
        "overlapped": overlapped > 0,
        "writes_after_turn_end": overlapped,
        "durable_before_next_turn": before_next,
        "turns": len(saves),
    }
