"""The conversation states the daemon holds, and which state continues a prompt: the one place that acquires,
keeps, restores and releases a Live (daemon/scheduler.py steps the turns that use them).

Which state continues a prompt:
- a session's turn: its hot Live if it is that session's head, else the head snapshot (the hottest tier
  that has it), else (no head, corrupt, another model) a fresh state: the turn then feeds the whole
  conversation from the transcript. Slower, never lost. A head that awaits a reply which never came (the
  daemon killed mid-reply, a branch taken mid-turn) continues only a turn that asks that message again;
  another message continues from the head's parent (service.py `turn_from`).
- an anonymous turn (a stock OpenAI client resending its history): the hot Live or the longest stored
  snapshot whose token ids are an exact prefix of the request's; the turn feeds only the rest.
- a restore: the snapshot itself (an unusable one is an error there, not a fallback); `restore` loads it
  and keeps it hot, `reset` starts a session over and drops its hot state.
- a save of a session that has only a transcript: the transcript, prefilled.

Not decided here: under load a prompt fed to an empty state may start from the KV cells of another resident
conversation that begins the same way (Turn.share_prefix, engine/llama_pool.py `share`); the state the turn
continues is still the one chosen here, and nothing is restored.

Hot states: the last `keep` conversations' Lives at their heads (least recently used dropped first), so
their next turn restores nothing; as many as the scheduler runs at once, one on a backend that runs one
turn at a time. A turn `take`s the Live it continues (it stops being a copy of its head), and `keep`
makes the state after a turn hot again.

A Live the daemon stops needing is released (engine.release: a llama.cpp backend frees its sequence),
but only on the worker thread, the one thread that runs the model: routes on the event loop may drop a
hot state (a session deleted) while a turn runs, so a dropped Live is set aside ("retired") and released
by the worker's next `release_retired`.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine
from engramctl.errors import NotFound, SnapshotCorrupt, SnapshotError
from engramctl.protocol import Restored
from engramctl.state.codec import from_payload
from engramctl.store.records import SessionInfo
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

_TRIES = 4  # an unusable snapshot is dropped (corrupt) or skipped: look again, a few times


@dataclass(frozen=True)
class Origin:
    """Where a turn's state came from."""

    tier: str | None = None  # "live" (a hot state) | "vram" | "ram" | "disk" | None (a fresh state)
    restored_tokens: int = 0
    restore_ms: float | None = None
    parent: str | None = None  # the snapshot the state is (None: new)

    @property
    def hot(self) -> bool:
        return self.tier == "live"


@dataclass(frozen=True)
class Hot:
    """`session`'s state at snapshot `head`."""

    session: str
    head: str | None
    live: Live


class StateCache:
    def __init__(self, engine: Engine, store: Store, *, reuse: bool = True, keep: int = 1):
        self.engine, self.store = engine, store
        self.reuse = reuse  # False only for benchmarks: no hot state, no prefix lookup
        self.keep_max = max(1, keep)
        self._lock = threading.Lock()
        self._hot: collections.OrderedDict[str, Hot] = collections.OrderedDict()  # session -> Hot, oldest first
        self._retired: list[Live] = []

    # -- the hot states ---------------------------------------------------------------------------------
    @property
    def current(self) -> Hot | None:
        """The most recently kept hot state."""
        with self._lock:
            return next(reversed(self._hot.values()), None)

    def hot(self) -> list[Hot]:
        with self._lock:
            return list(self._hot.values())

    def is_hot(self, session: str, head: str | None) -> bool:
        with self._lock:
            h = self._hot.get(session)
        return h is not None and head is not None and h.head == head

    def _live_for(self, session: str, head: str | None) -> Live | None:
        with self._lock:
            h = self._hot.get(session)
        return h.live if h is not None and head is not None and h.head == head else None

    def take(self, live: Live) -> None:
        """`live` is about to change (a turn continues it): it stops being a valid copy of its head."""
        with self._lock:
            for name, h in list(self._hot.items()):
                if h.live is live:
                    del self._hot[name]
            self._retired = [x for x in self._retired if x is not live]

    def keep(self, session: str, head: str | None, live: Live) -> None:
        """`live` is `session`'s state at `head`: keep it hot (reuse), else release it. A state whose
        snapshot failed (head None) is released: the next turn re-prefills the transcript."""
        if not self.reuse or head is None:
            self.engine.release(live)
            self.release_retired()
            return
        with self._lock:
            self._retired = [x for x in self._retired if x is not live]
            old = self._hot.pop(session, None)
            if old is not None and old.live is not live:
                self._retired.append(old.live)
            self._hot[session] = Hot(session, head, live)
            while len(self._hot) > self.keep_max:
                _, lru = self._hot.popitem(last=False)
                self._retired.append(lru.live)
        self.release_retired()

    def drop(self, session: str | None = None) -> None:
        """Forget the hot state of `session` (of every session: None); its Live is retired. Any thread."""
        with self._lock:
            for name in [n for n in self._hot if session is None or n == session]:
                self._retired.append(self._hot.pop(name).live)

    def give_back(self, live: Live, origin: Origin) -> None:
        """A state acquired for a turn that was refused: a hot one stays hot, one loaded for it is released."""
        if not origin.hot:
            self.engine.release(live)

    def release(self, live: Live) -> None:
        """Nothing can continue from `live` (a turn failed half-way). Worker thread only."""
        self.take(live)
        self.engine.release(live)

    def release_retired(self) -> None:
        """Release the retired Lives. Worker thread only."""
        with self._lock:
            lives, self._retired = self._retired, []
        for live in lives:
            self.engine.release(live)

    # -- a restore, a reset -----------------------------------------------------------------------------
    def restore(self, session: str, head: str | None, before: Callable[[], Any] | None, n_messages: int) -> Restored:
        """`session` continues from `head` (its state loaded and kept hot) once `before` has moved the
        session there (engram_api/restore.py resolved both); an unusable snapshot is an error here."""
        live, origin = (None, Origin()) if head is None else self.at_head(session, head)
        try:
            if before is not None:
                before()
        except BaseException:
            if live is not None:
                self.give_back(live, origin)
            raise
        if live is not None:
            self.keep(session, head, live)
        tokens = 0 if live is None else len(live.token_ids)
        return Restored(session, head, tokens, origin.tier, origin.restore_ms, n_messages)

    def reset(self, session: str) -> tuple[str | None, SessionInfo]:
        """Start the session over (no state, empty transcript) and drop its hot state; its snapshots are
        kept, each with the transcript it was taken at. Returns (previous head, SessionInfo)."""
        previous = self.store.sessions.get(session).head
        info = self.store.sessions.reset(session)
        self.drop(session)
        self.release_retired()
        return previous, info

    # -- which state continues a prompt ---------------------------------------------------------------
    def load(self, snapshot_id: str) -> tuple[Live, Origin]:
        """The snapshot, injected into a new Live; SnapshotError / NotFound when it cannot be used."""
        t0 = time.perf_counter()
        # every way into the store checked the values (a capture's to_payload, an import's from_payload); a file
        # read now gets a second look, piece by piece as it is read (store/reader.py), not a pass of its own
        loaded = self.store.snapshots.load_from(snapshot_id, into=self.engine.place)
        (tensors, meta), came_from = loaded
        state = from_payload(tensors, meta, self.engine.spec, check_values=False)
        live = self.engine.inject(state)
        tier = "ram" if came_from == "pending" else came_from  # saved, not yet written: in memory
        ms = round((time.perf_counter() - t0) * 1000, 2)
        return live, Origin(tier, len(live.token_ids), ms, snapshot_id)

    def at_head(self, session: str, head: str) -> tuple[Live, Origin]:
        """The state at `head` for a restore: hot, else loaded (an unusable snapshot raises)."""
        live = self._live_for(session, head)
        if live is not None:
            return live, Origin("live", len(live.token_ids), 0.0, head)
        return self.load(head)

    def for_session(
        self, session: str, head: str | None, transcript: list[dict], *, follow_head: bool = True
    ) -> tuple[Live, Origin]:
        """The session's state at `head`: hot, else loaded, else a fresh one. A corrupt head is dropped
        by the store and the session falls back to its parent: with follow_head that one is tried next."""
        live = self._live_for(session, head) if self.reuse else None
        if live is not None:
            return live, Origin("live", len(live.token_ids), 0.0, head)
        for _ in range(_TRIES):
            if head is None:
                break
            try:
                return self.load(head)
            except (SnapshotError, NotFound) as e:
                log.warning("session %s: snapshot %s cannot be used (%s)", session, head, e.message)
            if not follow_head:
                break
            try:
                fallback = self.store.sessions.get(session).head
            except NotFound:
                fallback = None
            head = None if fallback == head else fallback
        if transcript:
            log.info("session %s: re-prefilling its %d messages", session, len(transcript))
        return self.engine.new_live(), Origin()

    def longest_prefix(self, ids: list[int]) -> tuple[Live, Origin, str | None]:
        """The state holding the longest stored prefix of `ids` (a hot one first), and its session."""
        if not self.reuse:
            return self.engine.new_live(), Origin(), None
        best: Hot | None = None
        for h in self.hot():
            n = len(h.live.token_ids)
            if 0 < n <= len(ids) and h.live.token_ids == ids[:n] and (best is None or n > len(best.live.token_ids)):
                best = h
        if best is not None:
            n = len(best.live.token_ids)
            return best.live, Origin("live", n, 0.0, best.head), best.session
        for _ in range(_TRIES):
            hit = self.store.snapshots.find_prefix(ids, self.engine.info.fingerprint)
            if hit is None:
                break
            rec, _n = hit
            try:
                live, origin = self.load(rec.id)
                return live, origin, rec.session
            except (SnapshotError, NotFound) as e:
                log.warning("snapshot %s matched the prompt but cannot be used (%s)", rec.id, e.message)
                if isinstance(e, SnapshotError) and not isinstance(e, SnapshotCorrupt):
                    break  # intact but unusable (another dtype, say): it would match again
        return self.engine.new_live(), Origin(), None

    def from_transcript(self, transcript: list[dict]) -> Live:
        """A new state that has consumed the transcript (rendered without a generation prompt)."""
        tok = self.engine.tokenizer
        text = tok.render(transcript, add_generation_prompt=False)
        ids = tok.encode(text)
        self.engine.check_context(len(ids))
        live = self.engine.new_live()
        try:
            self.engine.prefill(live, ids)
        except BaseException:
            self.engine.release(live)
            raise
        live.text = text
        return live
