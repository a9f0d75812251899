"""An N-turn chat with fixed user messages, two ways, turn by turn interleaved (so a load change on a
shared machine hits both alike):

- stateful: what the daemon does for a named session. Each turn restores the session's head snapshot
  from the store (the hottest tier holding it), prefills only the new tokens (the chat template's
  delta), captures the prompt state, generates greedily, and after the last token settles the state
  and commits a prompt and a reply snapshot (RAM tier + write-through on the store's writer thread).
- stateless: what a server without state does: every turn renders the whole history with the chat
  template, tokenizes it and prefills all of it into a fresh state, then generates. Its history is
  the stateful side's transcript (the same user messages and replies), exactly what a client would
  resend, so both sides hold the same conversation and their token counts compare like for like.

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
from engramctl.engine.chat import plan_turn
from engramctl.engine.sampling import SamplingParams
from engramctl.bench.timing import median, spread
from engramctl.errors import NotFound
from engramctl.state.codec import from_payload, to_payload

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
                rec = self.store.wait_durable(sid)
                self.durable_at[sid] = time.perf_counter()
                self.file_bytes[sid] = rec.nbytes
            except NotFound:
                self.durable_at[sid] = None

    def close(self) -> None:
        self._q.put(None)
        self._t.join()


def _eos_text(engine, finish) -> str:
    tok = engine.tokenizer
    if finish.reason == "stop" and finish.token_ids and finish.token_ids[-1] in tok.eos_ids:
        return tok.decode([finish.token_ids[-1]], skip_special=False)
    return ""


def _generate(engine, live, params: SamplingParams) -> tuple[Any, float, float]:
    """Generate; returns (finish, generate() call time, time the loop ended = last token sampled)."""
    t_gen = time.perf_counter()
    gen = engine.generate(live, params)
    for _ in gen:
        pass
    return gen, t_gen, time.perf_counter()


def stateful_turn(engine, store, watch: DurabilityWatch, head: str | None, transcript: list[dict],
                  turn: int, params: SamplingParams) -> tuple[dict[str, Any], str]:  # fmt: skip
    cpu0, t0 = time.process_time(), time.perf_counter()
    restore_ms, tier = 0.0, None
    if head is None:
        live = engine.new_live()
    else:
        tier = (store.info(head).tiers or ("?",))[0]
        tensors, meta = store.load(head)
        live = engine.inject(from_payload(tensors, meta, engine.spec))
        restore_ms = (time.perf_counter() - t0) * 1000
    user = {"role": "user", "content": user_message(turn)}
    transcript.append(user)
    text, reset = plan_turn(engine.tokenizer, live.text, transcript, engine.prefix_stable)
    if reset:
        live = engine.new_live()
    ids = engine.tokenizer.encode(text)
    t_prefill = time.perf_counter()
    engine.backend.prefill(live, ids)
    prefill_ms = (time.perf_counter() - t_prefill) * 1000
    live.text += text
    prompt_text, prompt_tokens = live.text, len(live.token_ids)
    prompt_state = engine.capture(live)
    gen, t_gen, t_last = _generate(engine, live, params)
    finish = gen.finish
    # -- the last token has been sampled (and would be on its way to the client) --
    t_save = time.perf_counter()
    engine.settle(live, gen)
    live.text = prompt_text + finish.text + _eos_text(engine, finish)
    t_cap = time.perf_counter()
    settle_ms = (t_cap - t_save) * 1000
    reply_state = engine.capture(live)
    capture_ms = (time.perf_counter() - t_cap) * 1000
    p_prompt = to_payload(prompt_state, engine.spec, {"stage": "prompt"})
    p_reply = to_payload(reply_state, engine.spec, {"stage": "reply"})
    t_commit = time.perf_counter()
    rec_p = store.commit(SESSION, p_prompt, parent=head, messages=[user])
    watch.watch(rec_p.id)
    rec_r = store.commit(SESSION, p_reply, parent=rec_p.id,
                         messages=[{"role": "assistant", "content": finish.text}])  # fmt: skip
    watch.watch(rec_r.id)
    t_end = time.perf_counter()
    transcript.append({"role": "assistant", "content": finish.text})
    row = {
        "prompt_tokens": prompt_tokens,
        "computed_tokens": len(ids),
        "reset": reset,
        "restored_from": tier,
        "restore_ms": round(restore_ms, 3),
        "prefill_ms": round(prefill_ms, 3),
        "ttft_ms": round(((t_gen - t0) + (finish.ttft_s or 0.0)) * 1000, 3),
        "time_ms": round((t_last - t0) * 1000, 3),
        "cpu_per_wall": round((time.process_time() - cpu0) / max(1e-9, t_end - t0), 2),
        "reply_tokens": len(finish.token_ids),
        "finish_reason": finish.reason,
        "_reply_ids": tuple(finish.token_ids),
        "_save": {
            "t_turn_start": t0, "t_last_token": t_last, "t_save_start": t_save, "t_turn_end": t_end, "t_commit": t_commit,
            "settle_ms": settle_ms, "capture_ms": capture_ms, "commit_ms": (t_end - t_commit) * 1000,
            "ids": [rec_p.id, rec_r.id],
        },  # fmt: skip
    }
    return row, rec_r.id


def stateless_turn(engine, transcript: list[dict], params: SamplingParams) -> dict[str, Any]:
    """`transcript` ends with the new user message; it is the same conversation the stateful side
    holds (its replies), as a client of a stateless server would resend it."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    ids = engine.tokenizer.encode(engine.tokenizer.render(transcript, add_generation_prompt=True))
    live = engine.new_live()
    t_prefill = time.perf_counter()
    engine.backend.prefill(live, ids)
    prefill_ms = (time.perf_counter() - t_prefill) * 1000
    gen, t_gen, t_last = _generate(engine, live, params)
    finish = gen.finish
    return {
        "prompt_tokens": len(ids),
        "computed_tokens": len(ids),
        "prefill_ms": round(prefill_ms, 3),
        "ttft_ms": round(((t_gen - t0) + (finish.ttft_s or 0.0)) * 1000, 3),
        "time_ms": round((t_last - t0) * 1000, 3),
        "cpu_per_wall": round((time.process_time() - cpu0) / max(1e-9, t_last - t0), 2),
        "reply_tokens": len(finish.token_ids),
        "_reply_ids": tuple(finish.token_ids),
    }


def run(engine, box, turns: int, reply_tokens: int, step: Callable[[str], None] = lambda _d: None) -> dict[str, Any]:
    """Both conversations, interleaved turn by turn. Returns per-turn rows and the save events."""
    params = SamplingParams(temperature=0.0, max_tokens=reply_tokens)
    store = box.store
    watch = DurabilityWatch(store)
    head: str | None = None
    transcript: list[dict] = []  # the conversation both sides hold: fixed user messages, the stateful replies
    rows = []
    try:
        for k in range(turns):
            sf, head = stateful_turn(engine, store, watch, head, transcript, k, params)
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
            "time_per_turn_ms": median(times), "time_per_turn_spread_ms": spread(times),
            "ttft_ms": median(ttft), "ttft_spread_ms": spread(ttft),
            "last_turn_time_ms": times[-1] if times else None, "last_turn_ttft_ms": ttft[-1] if ttft else None,
            "total_s": round(sum(times) / 1000, 3),
            "cpu_per_wall": median(r["cpu_per_wall"] for r in rs),
        }  # fmt: skip

    per_turn = []
    for r in rows:
        a, b = r["stateful"], r["stateless"]
        per_turn.append({
            "turn": r["turn"],
            "prompt_tokens": a["prompt_tokens"],
            "computed_stateful": a["computed_tokens"],
            "computed_stateless": b["computed_tokens"],
            "time_stateful_ms": a["time_ms"], "time_stateless_ms": b["time_ms"],
            "ttft_stateful_ms": a["ttft_ms"], "ttft_stateless_ms": b["ttft_ms"],
            "restore_ms": a["restore_ms"], "restored_from": a["restored_from"],
            "prefill_stateful_ms": a["prefill_ms"], "prefill_stateless_ms": b["prefill_ms"],
            "reply_tokens": a["reply_tokens"], "reset": a["reset"],
            "same_reply": a["_reply_ids"] == b["_reply_ids"],
        })  # fmt: skip
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
