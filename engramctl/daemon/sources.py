"""Where a turn's state comes from.

- a session's turn: the hot Live if it is that session's head, else the head snapshot (the hottest
  tier that has it), else (no head, corrupt, another model) a fresh state: the turn then feeds the
  whole conversation from the transcript. Slower, never lost.
- an anonymous turn (a stock OpenAI client resending its history): the hot Live or the longest stored
  snapshot whose token ids are an exact prefix of the request's; the turn feeds only the rest.
- a restore: the snapshot itself (an unusable one is an error there, not a fallback).
- a save of a session that has only a transcript: the transcript, prefilled.

A Live returned here may be the hot one, still hot: the service `take`s it once the turn is planned.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from engramctl.daemon.hot import HotState
from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine
from engramctl.errors import NotFound, SnapshotCorrupt, SnapshotError
from engramctl.state.codec import from_payload
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

_TRIES = 4  # an unusable snapshot is dropped (corrupt) or skipped: look again, a few times


@dataclass(frozen=True)
class Origin:
    """Where a turn's state came from."""

    tier: str | None = None  # "live" (the hot state) | "vram" | "ram" | "disk" | None (a fresh state)
    restored_tokens: int = 0
    restore_ms: float | None = None
    parent: str | None = None  # the snapshot the state is (None: new)

    @property
    def hot(self) -> bool:
        return self.tier == "live"


class StateSources:
    def __init__(self, engine: Engine, store: Store, hot: HotState, *, reuse: bool = True):
        self.engine, self.store, self.hot = engine, store, hot
        self.reuse = reuse  # False only for benchmarks: no hot state, no prefix lookup

    def load(self, snapshot_id: str) -> tuple[Live, Origin]:
        """The snapshot, injected into a new Live; SnapshotError / NotFound when it cannot be used."""
        t0 = time.perf_counter()
        (tensors, meta), came_from = self.store.load_from(snapshot_id)
        # every way into the store checked the values (a capture's to_payload, an import's from_payload);
        # only a file read now gets a second look
        state = from_payload(tensors, meta, self.engine.spec, check_values=came_from == "disk")
        live = self.engine.inject(state)
        tier = "ram" if came_from == "pending" else came_from  # saved, not yet written: in memory
        ms = round((time.perf_counter() - t0) * 1000, 2)
        return live, Origin(tier, len(live.token_ids), ms, snapshot_id)

    def at_head(self, session: str, head: str) -> tuple[Live, Origin]:
        """The state at `head` for a restore: hot, else loaded (an unusable snapshot raises)."""
        live = self.hot.live_for(session, head)
        if live is not None:
            return live, Origin("live", len(live.token_ids), 0.0, head)
        return self.load(head)

    def for_session(
        self, session: str, head: str | None, transcript: list[dict], *, follow_head: bool = True
    ) -> tuple[Live, Origin]:
        """The session's state at `head`: hot, else loaded, else a fresh one. A corrupt head is dropped
        by the store and the session falls back to its parent: with follow_head that one is tried next."""
        live = self.hot.live_for(session, head) if self.reuse else None
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
                fallback = self.store.get_session(session).head
            except NotFound:
                fallback = None
            head = None if fallback == head else fallback
        if transcript:
            log.info("session %s: re-prefilling its %d messages", session, len(transcript))
        return self.engine.new_live(), Origin()

    def longest_prefix(self, ids: list[int]) -> tuple[Live, Origin, str | None]:
        """The state holding the longest stored prefix of `ids`, and the session it belongs to."""
        if not self.reuse:
            return self.engine.new_live(), Origin(), None
        hot = self.hot.current
        n = 0 if hot is None else len(hot.live.token_ids)
        if hot is not None and 0 < n <= len(ids) and hot.live.token_ids == ids[:n]:
            return hot.live, Origin("live", n, 0.0, hot.head), hot.session
        for _ in range(_TRIES):
            hit = self.store.find_prefix(ids, self.engine.info.fingerprint)
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
