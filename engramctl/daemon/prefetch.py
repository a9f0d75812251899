"""After a start, the states the next turns are most likely to ask for are read into the memory tiers before they do.

The candidates are the heads of the sessions and the prefix states of the loaded model, most recently used first
(a session's last use or its head's, a prefix state's last restore: the store's last-used order). One background
thread loads them through the store's one entry point (Snapshots.load_from), which puts each in the hottest memory
tier with room, and checks each as a turn's load from disk would (state/codec.py from_payload: model, dtype,
layout, finite values), so that a turn finding it in memory needs no second look. It loads only what fits in what
the VRAM and RAM tiers have free (their budgets less what they hold), so it never evicts a hot copy; a state that
does not fit is skipped and a smaller, older one may still be loaded. When it is done, the states it loaded are
marked used again oldest first, so the tiers' least-recently-used order and the index's last-used times say what
they said before the restart (each load marks its state used at the moment it was read).

A turn that asks for a state while it loads waits for that load (store/inflight.py) and never reads it twice; the
thread runs at a lower CPU priority than the worker. On the llama.cpp backend the states land in RAM: its VRAM
tier (device copies, engine/llama_device_copies.py) holds only states the worker parked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from engramctl.errors import EngramError, StoreClosed
from engramctl.state.codec import from_payload
from engramctl.state.spec import StateSpec
from engramctl.store.records import payload_nbytes
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

HOT_TIERS = ("vram", "ram")  # hottest first, as the store's placement orders them
NICE = 5  # the thread's CPU priority below the worker's (Linux: per thread)


@dataclass(frozen=True)
class Candidate:
    snapshot_id: str
    kind: str  # "session" (a session's head) or "prefix" (a prefix state)
    name: str  # the session's name; the prefix state's token count for a prefix
    last_used: float
    size_bytes: int  # its own file and every KV block it uses: at least the payload's bytes in memory


def candidates(store: Store, fingerprint: str) -> list[Candidate]:
    """Session heads and prefix states of the model with `fingerprint`, on disk and in no memory tier yet, most
    recently used first."""
    found: dict[str, Candidate] = {}
    for s in store.sessions.list():
        if s.head is None or s.fingerprint != fingerprint:
            continue
        try:
            rec = store.snapshots.info(s.head)
        except EngramError:
            continue
        if rec.durable and not set(rec.tiers) & set(HOT_TIERS) and rec.fingerprint == fingerprint:
            used = max(s.last_used, rec.last_access)
            if rec.id not in found or found[rec.id].last_used < used:
                found[rec.id] = Candidate(rec.id, "session", s.name, used, rec.nbytes)
    for rec in store.prefixes.list():
        if rec.durable and not set(rec.tiers) & set(HOT_TIERS) and rec.fingerprint == fingerprint:
            found.setdefault(rec.id, Candidate(rec.id, "prefix", f"{rec.n_tokens} tokens", rec.last_access, rec.nbytes))
    return sorted(found.values(), key=lambda c: (-c.last_used, c.snapshot_id))


def free_bytes(store: Store) -> dict[str, int]:
    """What each memory tier of the store's plan has free now: its budget less what it holds."""
    plan = store.retention.plan
    if plan is None:
        return {}
    usage = store.retention.usage()
    return {t: max(0, plan.budget(t) - usage.get(t, (0, 0))[0]) for t in HOT_TIERS if plan.budget(t) > 0}


class Prefetch:
    """The background load of the most recently used states; `status` is /v1/status's `prefetched`."""

    def __init__(self, store: Store, spec: StateSpec):
        self.store, self.spec = store, spec
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._chosen = self._loaded = self._bytes = self._skipped = self._failed = 0
        self._started = self._ended = None

    def start(self) -> None:
        """Start the background load (once)."""
        if self._thread is not None:
            return
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="engram-prefetch", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Load nothing more; wait for the load in progress (the store must outlive it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it is done; False on timeout (or when it never started)."""
        if self._thread is None:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def status(self) -> dict[str, Any]:
        with self._lock:
            done = self._ended is not None or self._thread is None  # never started: nothing to wait for
            ms = None if self._started is None else ((self._ended or time.perf_counter()) - self._started) * 1000
            return {
                "states": self._loaded,
                "bytes": self._bytes,
                "loading": 0 if done else max(0, self._chosen - self._loaded - self._skipped - self._failed),
                "skipped": self._skipped,  # did not fit what the memory tiers had free
                "failed": self._failed,  # unreadable or unusable (the turn that needs it falls back as it would)
                "done": done,
                "ms": None if ms is None else round(ms, 1),
            }

    # -- the thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):  # not Linux, or not allowed: the same priority as the worker
            pass
        loaded: list[str] = []
        try:
            chosen = candidates(self.store, self.spec.fingerprint)
            with self._lock:
                self._chosen = len(chosen)
            for c in chosen:
                if self._stop.is_set():
                    break
                if self._load(c):
                    loaded.append(c.snapshot_id)
            for sid in reversed(loaded):  # oldest first: the most recently used ends the most recently used
                if self._stop.is_set():
                    break
                if set(self.store.snapshots.info(sid).tiers) & set(HOT_TIERS):  # never read one evicted since
                    self.store.snapshots.load_from(sid)  # in memory: marks it used, reads nothing
        except StoreClosed:
            pass
        except Exception:
            log.exception("prefetch stopped")
        finally:
            with self._lock:
                self._ended = time.perf_counter()
            s = self.status()
            if s["states"] or s["skipped"] or s["failed"]:
                log.info(
                    "prefetched %d states (%d bytes) in %.0f ms; %d did not fit, %d failed",
                    s["states"],
                    s["bytes"],
                    s["ms"] or 0,
                    s["skipped"],
                    s["failed"],
                )

    def _load(self, c: Candidate) -> bool:
        if not any(room >= c.size_bytes for room in free_bytes(self.store).values()):
            with self._lock:
                self._skipped += 1
            return False
        try:
            (tensors, meta), tier = self.store.snapshots.load_from(c.snapshot_id)
            from_payload(tensors, meta, self.spec, check_values=False)  # load_from checked a read's values
        except StoreClosed:
            raise
        except EngramError as e:
            log.warning("prefetch: %s %s (%s) cannot be used: %s", c.kind, c.name, c.snapshot_id, e.message)
            with self._lock:
                self._failed += 1
            return False
        with self._lock:
            self._loaded += 1
            self._bytes += payload_nbytes((tensors, meta))
        return True
