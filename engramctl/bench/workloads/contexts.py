"""Context sweep: for each length L, what a conversation of L tokens costs to resume.

Per run (after one warm-up run at the first L that is not counted):
1. prefill: a fresh state prefills L tokens of seeded filler (chunked exactly like the daemon);
   then a new 32-token message is prefilled on top and the first token sampled:
   ttft_prefill = prefill(L) + prefill(32) + first token (the capture in between is not counted).
2. the state after L is captured, committed to the store (RAM tier + write-through) and flushed:
   snapshot_bytes is the file size; commit_ms / write_ms are the save costs.
3. restore from RAM: Store.load (RAM-tier hit) + from_payload (the daemon's checks: metadata, every
   shape and dtype; the NaN/Inf scan only for a file read now, as the payload in RAM was scanned when
   it was saved) + Engine.inject into a fresh cache; ttft_restored adds prefill(32) + first token.
   Then the same after another conversation ran a prefill in between (restore_ram_after_other): on
   llama.cpp the first restore finds the state still kept in the context (engine/llama_pool.py), the
   second copies it in; on transformers they are the same path.
4. restore from disk: the store is closed and reopened (a fresh process's view: RAM tier empty), the
   file and its KV blocks' are evicted from the page cache (posix_fadvise DONTNEED; mincore says whether it
   worked), then the same load path reads, checksums and decodes it.
The logits after the message are compared between the prefill path and both restore paths
(max_abs_logit_diff): a restore that is fast but wrong would show here.
"""

from __future__ import annotations

from typing import Any, Callable

from engramctl.bench import coldio
from engramctl.bench.material import filler_ids
from engramctl.bench.timing import Clock, Sample, Series
from engramctl.engine.sampling import SamplingParams
from engramctl.state.codec import from_payload, to_payload

FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)


def first_token(engine, live) -> int:
    gen = engine.generate(live, FIRST_TOKEN)
    for _ in gen:
        pass
    return gen.finish.token_ids[0]


class _Run:
    """One run's samples at one L."""

    def __init__(self) -> None:
        self.s: dict[str, Sample] = {}
        self.v: dict[str, Any] = {}


def _one_run(engine, box, L: int, ids: list[int], msg: list[int], run: int) -> _Run:
    r = _Run()
    # 1. re-prefill
    live = engine.new_live()
    with Clock() as c:
        engine.prefill(live, ids)
    r.s["prefill"] = c.sample
    state = engine.capture(live)
    with Clock() as c:
        engine.prefill(live, msg)
        ref_logits = live.last_logits  # replaced, never mutated, by later forwards: no copy needed
        first_token(engine, live)
    r.s["ttft_prefill"] = r.s["prefill"] + c.sample
    engine.release(live)
    # 2. save
    payload = to_payload(state, engine.spec, {"stage": "bench", "bench_tokens": str(L)})
    r.v["state_bytes"] = state.nbytes
    store = box.store
    with Clock() as c:
        rec = store.snapshots.commit(f"bench-ctx-{L}", payload)
    r.s["commit"] = c.sample
    with Clock() as c:
        store.flush()
    r.s["write"] = c.sample
    info = store.snapshots.info(rec.id)
    r.v["snapshot_bytes"] = info.nbytes
    r.v["ram_tier"] = info.tiers[0] if info.tiers else None
    # 3. restore from RAM, twice: right away, then after another conversation used the engine (on
    # llama.cpp the first finds the state still kept in the context, the second loads it by one copy)
    logits_ram = _restore_and_answer(engine, store, rec.id, msg, r, "restore_ram", "ttft_restored")
    other = engine.new_live()
    engine.prefill(other, msg)
    engine.release(other)
    logits_other = _restore_and_answer(engine, store, rec.id, msg, r, "restore_ram_after_other", "ttft_after_other")
    # 4. restore from disk (cold)
    store = box.reopen()
    paths = store.snapshots.files(rec.id)  # its own file and its KV blocks' (store/blocks.py)
    evicted = [coldio.evict(p) for p in paths]  # every one: all() of a generator would stop at a False
    r.v["evicted"], r.v["files"] = all(evicted), len(paths)
    fractions = [coldio.cached_fraction(p) for p in paths]
    r.v["cached_fraction"] = None if None in fractions else max(fractions)
    r.v["disk_tier"] = (store.snapshots.info(rec.id).tiers or ("?",))[0]
    logits_disk = _restore_and_answer(engine, store, rec.id, msg, r, "restore_disk", "ttft_restored_disk")
    r.v["max_abs_logit_diff"] = max(float(abs(x - ref_logits).max()) for x in (logits_ram, logits_other, logits_disk))
    return r


def _restore_and_answer(engine, store, sid: str, msg: list[int], r: _Run, restore_key: str, ttft_key: str):
    """Restore `sid`, feed the new message, sample its first token; records the restore's parts under
    `restore_key`_* and restore + first token under `ttft_key`. Returns the logits after the message."""
    live, samples = _restore(engine, store, sid)
    r.s.update({f"{restore_key}_{k}": v for k, v in samples.items()})
    with Clock() as c:
        engine.prefill(live, msg)
        logits = live.last_logits
        first_token(engine, live)
    r.s[ttft_key] = samples["total"] + c.sample
    engine.release(live)
    return logits


def _restore(engine, store, sid: str):
    with Clock() as c1:
        (tensors, meta), came_from = store.snapshots.load_from(sid)
    with Clock() as c2:  # the checks the daemon makes (sources.StateSources.load)
        state = from_payload(tensors, meta, engine.spec, check_values=came_from == "disk")
    with Clock() as c3:
        live = engine.inject(state)
    return live, {
        "load": c1.sample,
        "check": c2.sample,
        "inject": c3.sample,
        "total": c1.sample + c2.sample + c3.sample,
    }


def run(
    engine,
    box,
    contexts: list[int],
    runs: int,
    seed: int,
    message_tokens: int = 32,
    step: Callable[[str], None] = lambda _d: None,
) -> list[dict[str, Any]]:
    """One row per L. `step(description)` is called after every run (warm-up included)."""
    tok = engine.tokenizer
    msg = filler_ids(tok, message_tokens, seed + 1)
    out = []
    for i, L in enumerate(contexts):
        ids = filler_ids(tok, L, seed)
        if i == 0:
            _one_run(engine, box, L, ids, msg, run=-1)  # warm-up, not counted
            step(f"context {L}: warm-up")
        series: dict[str, Series] = {}
        values: list[dict[str, Any]] = []
        for r in range(runs):
            res = _one_run(engine, box, L, ids, msg, run=r)
            for k, s in res.s.items():
                series.setdefault(k, Series()).add(s)
            values.append(res.v)
            step(f"context {L}: run {r + 1}/{runs}")
        out.append(_row(L, series, values, message_tokens))
    return out


def _row(L: int, series: dict[str, Series], values: list[dict[str, Any]], message_tokens: int) -> dict[str, Any]:
    def med(key: str) -> float | None:
        return series[key].median_ms() if key in series else None

    snap = sorted(v["snapshot_bytes"] for v in values)[len(values) // 2]
    prefill, ram, disk = med("prefill"), med("restore_ram_total"), med("restore_disk_total")
    cached = [v["cached_fraction"] for v in values if v["cached_fraction"] is not None]
    timings = {
        "prefill": "prefill",
        "ttft_prefill": "ttft_prefill",
        "restore_ram": "restore_ram_total",
        "restore_ram_after_other": "restore_ram_after_other_total",
        "restore_disk": "restore_disk_total",
        "ttft_restored": "ttft_restored",
        "ttft_restored_disk": "ttft_restored_disk",
        "save_commit": "commit",
        "save_write": "write",
    }
    return {
        "tokens": L,
        "message_tokens": message_tokens,
        "prefill_ms": prefill,
        "restore_ram_ms": ram,
        "restore_ram_after_other_ms": med("restore_ram_after_other_total"),
        "restore_disk_ms": disk,
        "ttft_restored_ms": med("ttft_restored"),
        "ttft_restored_disk_ms": med("ttft_restored_disk"),
        "ttft_prefill_ms": med("ttft_prefill"),
        "snapshot_bytes": snap,
        "state_bytes": values[0]["state_bytes"],
        "restore_disk_efficiency": None,  # filled in by the runner from the bandwidth floor
        "restore_ram_efficiency": None,
        "speedup_restore_ram": None if not ram else round(prefill / ram, 1),
        "speedup_restore_disk": None if not disk else round(prefill / disk, 1),
        "speedup_ttft": None if not med("ttft_restored") else round(med("ttft_prefill") / med("ttft_restored"), 1),
        "save_commit_ms": med("commit"),
        "save_write_ms": med("write"),
        "restore_ram_breakdown_ms": {k: med(f"restore_ram_{k}") for k in ("load", "check", "inject")},
        "restore_ram_after_other_breakdown_ms": {
            k: med(f"restore_ram_after_other_{k}") for k in ("load", "check", "inject")
        },
        "restore_disk_breakdown_ms": {k: med(f"restore_disk_{k}") for k in ("load", "check", "inject")},
        "restored_from": {"ram": values[0]["ram_tier"], "disk": values[0]["disk_tier"]},
        "disk_cold": {
            "evicted": all(v["evicted"] for v in values),
            "files": values[0]["files"],  # the snapshot's own and its KV blocks', every one evicted
            "cached_fraction_before_read": max(cached) if cached else None,
        },
        "max_abs_logit_diff": max(v["max_abs_logit_diff"] for v in values),
        "spread_ms": {name: series[key].spread_ms() for name, key in timings.items() if key in series},
        "cpu_per_wall": {name: series[key].cpu_per_wall() for name, key in timings.items() if key in series},
        "runs": len(values),
    }
