"""An N-turn chat with fixed user messages, two ways, turn by turn interleaved (so a load change on a
shared machine hits both alike):

- stateful: the daemon's own path for a named session (daemon/service.py, without HTTP and without
  the hot state, which would make every restore free): each turn restores the session's head snapshot
  from the store (the hottest tier holding it), runs the turn (engine/turn.py: only the chat
  template's delta is prefilled, the prompt state captured, the reply generated greedily, settled and
  captured) and records it: a prompt and a reply snapshot (RAM tier + write-through on the store's
  writer thread) and the transcript.
- stateless: what a server without state does: the same turn (engine/turn.py) from a fresh state, so
  every turn prefills the whole history, and nothing is captured. Its history is the stateful side's
  transcript (the same user messages and replies), exactly what a client would resend, so both sides
  hold the same conversation and their token counts compare like for like.

Per turn: prompt tokens (the conversation so far, as a stateless client sends it), tokens computed,
time from the request to the first token (TTFT) and to the last token, and whether both ways
generated the same reply (greedy; they differ only if a reply does not survive re-tokenization).
The stateful side's snapshot saves are timed against the stream (save.py).
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

from engramctl.bench.material import user_message
from engramctl.bench.timing import median, spread
from engramctl.daemon.service import ChatRequest, ConversationService
from engramctl.engine.sampling_params import SamplingParams
from engramctl.engine.turn import Turn
from engramctl.errors import NotFound

SESSION = "bench-chat"


class DurabilityWatch:
    """Timestamps when each committed snapshot becomes durable. The store's writer is one FIFO thread,
    so waiting on snapshots in commit order sees each one as soon as it is written."""

    def __init__(self, store) -> None:
        self.store = store
        self.durable_at: dict[str, float | None] = {}
        self.file_bytes: dict[str, int] = {}
        self._q: queue.Queue[str | None] = queue.Queue()
        self._t = threading.Thread(target=self._run, name="bench-durability", daemon=True)
        self._t.start()

    def watch(self, sid: str) -> None:
        self._q.put(sid)

    def _run(self) -> None:
        while True:
            sid = self._q.get()
            if sid is None:
                return
            try:
                rec = self.store.snapshots.wait_durable(sid)
                self.durable_at[sid] = time.perf_counter()
                self.file_bytes[sid] = rec.nbytes
            except NotFound:
                self.durable_at[sid] = None

    def close(self) -> None:
        self._q.put(None)
        self._t.join()


def stateful_turn(
    service, watch: DurabilityWatch, transcript: list[dict], turn: int, params: SamplingParams
) -> dict[str, Any]:
    """One turn of SESSION through the daemon's service; `transcript` gets the user message and the reply."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    user = {"role": "user", "content": user_message(turn)}
    r = service.run(service.chat(ChatRequest([user], SESSION, params)))
    t_end = time.perf_counter()
    ids = [sid for sid in (r.prompt_snapshot_id, r.snapshot_id) if sid is not None]
    for sid in ids:
        watch.watch(sid)
    transcript += [user, {"role": "assistant", "content": r.text}]
    return {
        "prompt_tokens": r.prompt_tokens,
        "computed_tokens": r.computed_tokens,
        "reset": r.reset,
        "restored_from": r.tier,
        "restore_ms": round(r.restore_ms or 0.0, 3),
        "prefill_ms": round(r.prefill_ms, 3),
        "ttft_ms": round(((r.first_token_at or r.last_token_at) - t0) * 1000, 3),
        "time_ms": round((r.last_token_at - t0) * 1000, 3),
        "cpu_per_wall": round((time.process_time() - cpu0) / max(1e-9, t_end - t0), 2),
        "reply_tokens": r.completion_tokens,
        "finish_reason": r.finish_reason,
        "_reply_ids": r.token_ids,
        "_save": {
            "t_turn_start": t0,
            "t_last_token": r.last_token_at,
            "t_save_start": r.last_token_at,
            "t_turn_end": t_end,
            "t_commit": r.record_started_at,
            "settle_ms": r.settle_ms,
            "capture_ms": r.capture_ms,
            "commit_ms": r.record_ms,
            "ids": ids,
        },
    }


def stateless_turn(engine, transcript: list[dict], params: SamplingParams) -> dict[str, Any]:
    """`transcript` ends with the new user message; it is the same conversation the stateful side
    holds (its replies), as a client of a stateless server would resend it."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    done = Turn.for_messages(engine, engine.new_live(), transcript, params, capture=False).run()
    cpu_per_wall = round((time.process_time() - cpu0) / max(1e-9, time.perf_counter() - t0), 2)
    engine.release(done.live)
    return {
        "prompt_tokens": done.prompt.prompt_tokens,
        "computed_tokens": done.prompt.computed_tokens,
        "prefill_ms": round(done.prompt.prefill_ms, 3),
        "ttft_ms": round(((done.first_token_at or done.last_token_at) - t0) * 1000, 3),
        "time_ms": round((done.last_token_at - t0) * 1000, 3),
        "cpu_per_wall": cpu_per_wall,
        "reply_tokens": len(done.finish.token_ids),
        "_reply_ids": tuple(done.finish.token_ids),
    }


def run(engine, box, turns: int, reply_tokens: int, step: Callable[[str], None] = lambda _d: None) -> dict[str, Any]:
    """Both conversations, interleaved turn by turn. Returns per-turn rows and the save events."""
    params = SamplingParams(temperature=0.0, max_tokens=reply_tokens)
    store = box.store
    service = ConversationService(engine, store, reuse=False)
    watch = DurabilityWatch(store)
    transcript: list[dict] = []  # the conversation both sides hold: fixed user messages, the stateful replies
    rows = []
    try:
        for k in range(turns):
            sf = stateful_turn(service, watch, transcript, k, params)
            sl = stateless_turn(engine, transcript[:-1], params)
            rows.append({"turn": k + 1, "stateful": sf, "stateless": sl})
            step(f"turn {k + 1}/{turns}")
        store.flush()
    finally:
        watch.close()
    for row in rows:
        save = row["stateful"]["_save"]
        save["durable_at"] = [watch.durable_at.get(s) for s in save["ids"]]
        save["bytes"] = [watch.file_bytes.get(s) for s in save["ids"]]
    return {"rows": rows}


def summarize(result: dict[str, Any], turns: int, reply_tokens: int) -> dict[str, Any]:
    """The JSON `multiturn` object (without the private per-turn save events)."""
    rows = result["rows"]
    sf = [r["stateful"] for r in rows]
    sl = [r["stateless"] for r in rows]
    computed_sf = sum(r["computed_tokens"] for r in sf)
    computed_sl = sum(r["computed_tokens"] for r in sl)

    def side(rs: list[dict]) -> dict[str, Any]:
        times = [r["time_ms"] for r in rs]
        ttft = [r["ttft_ms"] for r in rs]
        return {
            "time_per_turn_ms": median(times),
            "time_per_turn_spread_ms": spread(times),
            "ttft_ms": median(ttft),
            "ttft_spread_ms": spread(ttft),
            "last_turn_time_ms": times[-1] if times else None,
            "last_turn_ttft_ms": ttft[-1] if ttft else None,
            "total_s": round(sum(times) / 1000, 3),
            "cpu_per_wall": median(r["cpu_per_wall"] for r in rs),
        }

    per_turn = []
    for r in rows:
        a, b = r["stateful"], r["stateless"]
        per_turn.append(
            {
                "turn": r["turn"],
                "prompt_tokens": a["prompt_tokens"],
                "computed_stateful": a["computed_tokens"],
                "computed_stateless": b["computed_tokens"],
                "time_stateful_ms": a["time_ms"],
                "time_stateless_ms": b["time_ms"],
                "ttft_stateful_ms": a["ttft_ms"],
                "ttft_stateless_ms": b["ttft_ms"],
                "restore_ms": a["restore_ms"],
                "restored_from": a["restored_from"],
                "prefill_stateful_ms": a["prefill_ms"],
                "prefill_stateless_ms": b["prefill_ms"],
                "reply_tokens": a["reply_tokens"],
                "reset": a["reset"],
                "same_reply": a["_reply_ids"] == b["_reply_ids"],
            }
        )
    return {
        "turns": turns,
        "reply_tokens": reply_tokens,
        "prompt_tokens_sent": sum(r["prompt_tokens"] for r in sl),
        "prompt_tokens_computed": {"stateful": computed_sf, "stateless": computed_sl},
        "token_reduction": None if not computed_sl else round(1 - computed_sf / computed_sl, 4),
        "stateful": side(sf),
        "stateless": side(sl),
        "resets": sum(1 for r in sf if r["reset"]),
        "same_replies": sum(1 for p in per_turn if p["same_reply"]),
        "per_turn": per_turn,
    }
