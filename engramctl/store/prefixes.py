"""Prefix states (a Store part: `store.prefixes`): the model state after a prompt's first tokens, kept for any
conversation that begins with those tokens.

    pid = store.prefixes.put(tensors, meta, token_ids)       # content-addressed by (model, dtype, format, ids)
    tensors, meta = store.prefixes.load(pid)                 # as Snapshots.load; marks it used (LRU)
    store.candidates.find(prompt_ids, fingerprint, ...)      # finds them beside snapshots (candidates.py)

A prefix state is a snapshot row of kind 'prefix' (schema.py): no session, parent, transcript or names; its
file and KV blocks are written like a snapshot's (the writer thread, snapshots.py `_write`), so its attention
KV shares blocks with the conversations, branches and other prefix states that hold the same tokens. It lives
in the memory tiers and on disk like a snapshot, survives restarts, and is kept within its own byte budget
(Settings.prefix_state_bytes; Retention.keep_prefixes), least recently used evicted first. It is not listed by
Snapshots.list or counted as a session's.
"""

from __future__ import annotations

from typing import Sequence

from engramctl.errors import NotFound, UsageError
from engramctl.store import arrays
from engramctl.store.candidates import Candidates
from engramctl.store.core import StoreCore
from engramctl.store.records import TOKEN_IDS, Payload, SnapshotRecord, check_payload
from engramctl.store.retention import Retention
from engramctl.store.snapshots import Snapshots

KIND = "prefix"
STATE_KEYS = ("dtype", "state_format")  # besides the model: what a state of the same ids must share to be it


class Prefixes:
    def __init__(self, core: StoreCore, snapshots: Snapshots, retention: Retention, candidates: Candidates):
        self._core, self._snapshots, self._retention, self._candidates = core, snapshots, retention, candidates

    def put(self, tensors: dict, meta: dict[str, str], token_ids: Sequence[int]) -> str:
        """Store the state after `token_ids` (tensors and metadata as state/codec.to_payload makes them; a
        "token_ids" tensor, if there, must hold the same ids) and return its id. The same ids of the same model, dtype
        and state format (meta's "fingerprint", "dtype", "state_format") stored again is a no-op that returns
        the existing id (and marks it used).
        The store keeps the tensors as given (no copy): do not mutate them afterwards. Like Snapshots.commit,
        it returns at once: the payload is held in memory and written by the writer thread (`wait_durable`);
        one that cannot be written (disk full) is dropped, and no lookup finds it any more.
        Raises UsageError for a malformed payload or ids that disagree with it, DiskFull when the file system
        has no room."""
        ids = [int(t) for t in token_ids]
        if not ids:
            raise UsageError("a prefix state needs at least one token id.")
        if not isinstance(tensors, dict) or not isinstance(meta, dict):
            raise UsageError("a prefix state is a dict of tensors and a dict of metadata strings.")
        tensors = dict(tensors)
        if TOKEN_IDS in tensors:
            if not arrays.is_array(tensors[TOKEN_IDS]) or tensors[TOKEN_IDS].tolist() != ids:
                raise UsageError("the prefix state's token_ids tensor does not hold the token ids given with it.")
        else:
            like = next((t for t in tensors.values() if arrays.is_array(t)), None)
            if like is None:
                raise UsageError("a prefix state holds at least one tensor.")
            tensors[TOKEN_IDS] = arrays.int64_like(like, ids)
        meta = {**meta, "n_tokens": str(len(ids))}
        check_payload((tensors, meta))
        c = self._core
        with c.lock:  # one lookup and insert: two puts of the same ids store it once
            c.check_open()
            existing = self._same(ids, meta)
            if existing is not None:
                c.touched[existing] = c.clock()
                return existing
            pid = self._snapshots.index_prefix((tensors, meta), ids)
        self._snapshots.queue_write(pid)  # outside the lock: it waits while the writer's queue is full
        return pid

    def load(self, prefix_id: str, *, copy: bool = False) -> Payload:
        """The prefix state's payload (the same (tensors, metadata) as Snapshots.load, so
        state/codec.from_payload rebuilds it), from the hottest tier holding it or from disk (verified), and
        mark it used. NotFound when it was evicted; SnapshotCorrupt when its file or a KV block it uses is
        damaged (it is dropped: prefill without it)."""
        return self.load_from(prefix_id, copy=copy)[0]

    def load_from(self, prefix_id: str, *, copy: bool = False) -> tuple[Payload, str]:
        """load(), and where it came from (Snapshots.load_from: "vram", "ram", "pending" or "disk"; only a
        "disk" payload needs from_payload's check of its values)."""
        self.info(prefix_id)
        return self._snapshots.load_from(prefix_id, copy=copy)

    def info(self, prefix_id: str) -> SnapshotRecord:
        """The prefix state's record (kind "prefix", session ""). NotFound when there is none."""
        c = self._core
        with c.lock:
            rec = c.row(prefix_id)
            if rec.kind != KIND:
                raise NotFound(f"no prefix state {prefix_id}.")
            return c.with_tiers(rec)

    def list(self) -> list[SnapshotRecord]:
        """Every prefix state, oldest first."""
        c = self._core
        with c.lock:
            c.check_open()
            return [c.with_tiers(r) for r in c.index.snapshots(kind=KIND)]

    def usage(self) -> tuple[int, int, int]:
        """(bytes on disk: their own files and the KV blocks they use, how many, the prefix budget)."""
        c = self._core
        with c.lock:
            used, n = c.index.durable_bytes(KIND)
            return used, n, self._retention.prefix_budget()

    def usage_json(self) -> dict[str, int]:
        """usage() as `engramctl tiers` shows it (the daemon's /v1/tiers, or the store read without one)."""
        used, n, budget = self.usage()
        return {"count": n, "used_bytes": used, "budget_bytes": budget}

    def delete(self, prefix_id: str) -> None:
        with self._core.lock:
            self._core.remove([self.info(prefix_id).id])

    def wait_durable(self, prefix_id: str, timeout: float | None = None) -> SnapshotRecord:
        """Block until its files are written (Snapshots.wait_durable)."""
        return self._snapshots.wait_durable(prefix_id, timeout)

    def _same(self, ids: list[int], meta: dict[str, str]) -> str | None:
        """The stored prefix state of exactly these ids, model, dtype and state format, if any. Under the lock."""
        state = {k: meta[k] for k in STATE_KEYS if meta.get(k)}
        found = self._candidates.find(ids, meta.get("fingerprint"), state=state, kinds=(KIND,), min_tokens=len(ids))
        return found[0].id if found else None
