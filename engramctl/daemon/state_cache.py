"""The conversation states the daemon holds, and which state continues a prompt: the one place that acquires,
keeps, restores and releases a Live (daemon/scheduler.py steps the turns that use them).

Which state continues a prompt:
- a session's turn: its hot Live if it is that session's head, else the head snapshot (the hottest tier
  that has it), else (no head, corrupt, another model) a prefix state `for_prompt` finds for the conversation, else
  a fresh state: the turn then feeds the whole conversation. Slower, never lost. A head that awaits a reply
  which never came (the daemon killed mid-reply, a branch taken mid-turn) continues only a turn that asks
  that message again; another message continues from the head's parent (service.py `turn_from`).
- a prompt no session names (a stock OpenAI client resending its history, a raw completion; a session's first
  prompt too, from prefix states only): `for_prompt`, the one place that chooses among states by their token
  ids. The candidates are the hot Lives and what the store's one lookup returns (store/candidates.py: session
  snapshots and prefix states whose ids, compared, are a prefix of the prompt's, of this model, dtype and state
  format); each is ranked by what starting from it costs before the first new token (`RestoreCost`: reading its
  bytes from its tier, then prefilling the tokens it lacks), and only the cheapest is loaded (the next one only
  if it cannot be used). A candidate refused as intact but unusable is never tried again: a prefix state is
  dropped (a later prompt keeps a usable one), a snapshot is remembered as refused.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine
from engramctl.errors import NotFound, SnapshotCorrupt, SnapshotError
from engramctl.protocol import Restored
from engramctl.state.codec import Checked, from_payload
from engramctl.store.candidates import Candidate
from engramctl.store.records import SessionInfo
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

_TRIES = 4  # an unusable head is dropped (corrupt) and the session falls back to its parent: a few times
_CANDIDATES = 8  # the longest stored candidates of a prompt ranked: each is a token-id (and header) read


@dataclass(frozen=True)
class Origin:
    """Where a turn's state came from."""

    tier: str | None = None  # "live" (a hot state) | "vram" | "ram" | "disk" | None (a fresh state)
    restored_tokens: int = 0
    restore_ms: float | None = None
    parent: str | None = None  # the snapshot the state is (None: new, or a state no conversation owns)
    prefix: bool = False  # a prefix state (store/prefixes.py)

    @property
    def hot(self) -> bool:
        return self.tier == "live"


@dataclass(frozen=True)
class Hot:
    """`session`'s state at snapshot `head`."""

    session: str
    head: str | None
    live: Live


class RestoreCost:
    """What starting a prompt from a state costs before its first new token, in ms: reading the state's bytes
    from where it is, then prefilling the tokens it lacks. The rates are this daemon's own, averaged as it
    loads states and prefills prompts, from a CPU's guesses until it has measured them."""

    WEIGHT = 0.25  # of each new measurement in the running average

    def __init__(self) -> None:
        # bytes per ms: a hot Live costs nothing; memory tiers are a copy; a disk read is verified too
        self.load_bytes_per_ms = {"vram": 20e6, "ram": 4e6, "pending": 4e6, "disk": 0.5e6}
        self.prefill_ms_per_token = 5.0

    def ms(self, tier: str, size_bytes: int, tokens_left: int) -> float:
        load = 0.0 if tier == "live" else size_bytes / self.load_bytes_per_ms.get(tier, self.load_bytes_per_ms["disk"])
        return load + tokens_left * self.prefill_ms_per_token

    def loaded(self, tier: str, size_bytes: int, ms: float) -> None:
        if tier in self.load_bytes_per_ms and size_bytes > 0 and ms > 0:
            self.load_bytes_per_ms[tier] = self._average(self.load_bytes_per_ms[tier], size_bytes / ms)

    def prefilled(self, tokens: int, ms: float) -> None:
        if tokens >= 32 and ms > 0:  # a short prompt's time is mostly the step's fixed cost
            self.prefill_ms_per_token = self._average(self.prefill_ms_per_token, ms / tokens)

    def _average(self, old: float, new: float) -> float:
        return old + self.WEIGHT * (new - old)


class StateCache:
    def __init__(self, engine: Engine, store: Store, *, reuse: bool = True, keep: int = 1):
        self.engine, self.store = engine, store
        self.reuse = reuse  # False only for benchmarks: no hot state, no prefix lookup
        self.keep_max = max(1, keep)
        self._lock = threading.Lock()
        self._hot: collections.OrderedDict[str, Hot] = collections.OrderedDict()  # session -> Hot, oldest first
        self._retired: list[Live] = []
        self.cost = RestoreCost()
        self._refused: set[str] = set()  # snapshots found for a prompt but refused by this model (another dtype)
        self.checked = Checked()  # memory-tier payloads accepted once: restored again without their checks

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
    def load(self, snapshot_id: str, *, size_bytes: int = 0) -> tuple[Live, Origin]:
        """The snapshot (or prefix state), injected into a new Live; SnapshotError / NotFound when it cannot be
        used. `size_bytes` (what it reads from disk) times the load for RestoreCost."""
        t0 = time.perf_counter()
        # every way into the store checked the values (a capture's to_payload, an import's from_payload); a file
        # read now gets a second look, piece by piece as it is read (store/reader.py), not a pass of its own
        loaded = self.store.snapshots.load_from(snapshot_id, into=self.engine.place)
        (tensors, meta), came_from = loaded
        state = from_payload(tensors, meta, self.engine.spec, check_values=False, checked=self.checked)
        live = self.engine.inject(state)
        ms = round((time.perf_counter() - t0) * 1000, 2)
        self.cost.loaded(came_from, size_bytes, ms)
        tier = "ram" if came_from == "pending" else came_from  # saved, not yet written: in memory
        return live, Origin(tier, len(live.token_ids), ms, snapshot_id)

    def at_head(self, session: str, head: str) -> tuple[Live, Origin]:
        """The state at `head` for a restore: hot, else loaded (an unusable snapshot raises)."""
        live = self._live_for(session, head)
        if live is not None:
            return live, Origin("live", len(live.token_ids), 0.0, head)
        return self.load(head)

    def for_session(
        self, session: str, head: str | None, transcript: list[dict], *, follow_head: bool = True
    ) -> tuple[Live, Origin] | None:
        """The session's state at `head`: hot, else loaded; None when it has none that can be used (the caller
        starts it from `for_prompt` or a fresh state). A corrupt head is dropped by the store and the session
        falls back to its parent: with follow_head that one is tried next."""
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
            log.info("session %s: re-feeding its %d messages", session, len(transcript))
        return None

    def for_prompt(
        self,
        ids: Sequence[int],
        *,
        conversations: bool = True,
        prefixes: bool = True,
        wait: Callable[[int], Any] | None = None,
    ) -> tuple[Live, Origin, str | None]:
        """The state to start the prompt `ids` from: of every state holding a prefix of them, the one cheapest to
        start from, loaded; else a fresh one. Returns (live, origin, the session whose state it is or None).
        `conversations`: conversations' states count (hot Lives, session snapshots: the prompt continues that
        conversation); False for a named session's first prompt, which starts a conversation of its own;
        `prefixes`: prefix states count. `wait(n)` is called with the most tokens any candidate holds before
        anything is loaded: it may raise (the prompt waits for a longer state a running turn will keep),
        leaving nothing to give back."""
        if not self.reuse:
            return self.engine.new_live(), Origin(), None
        ids = list(ids)
        kinds = (("snapshot",) if conversations else ()) + (("prefix",) if prefixes else ())
        ranked = self._ranked(ids, kinds, hot=conversations)
        if wait is not None:
            wait(max((n for n, *_ in ranked), default=0))
        for n, hot, cand in ranked:
            if hot is not None:
                return hot.live, Origin("live", n, 0.0, hot.head), hot.session
            if cand is None:
                continue
            try:
                live, origin = self.load(cand.id, size_bytes=cand.size_bytes)
            except (SnapshotError, NotFound) as e:
                self._refuse(cand, e)
                continue
            if cand.kind == "prefix":
                return live, Origin(origin.tier, n, origin.restore_ms, None, prefix=True), None
            return live, origin, cand.session
        return self.engine.new_live(), Origin(), None

    def _ranked(
        self, ids: list[int], kinds: tuple[str, ...], *, hot: bool
    ) -> list[tuple[int, Hot | None, Candidate | None]]:
        """(tokens held, a hot state or a stored candidate of `kinds`) for every state holding a prefix of `ids`,
        cheapest start first (ties: the longest)."""
        found: list[tuple[float, int, Hot | None, Candidate | None]] = []
        heads = set()
        for h in self.hot() if hot else ():
            n = len(h.live.token_ids)
            if 0 < n <= len(ids) and h.live.token_ids == ids[:n]:
                found.append((self.cost.ms("live", 0, len(ids) - n), n, h, None))
                heads.add(h.head)
        spec = self.engine.spec
        stored = self.store.candidates.find(
            ids,
            self.engine.info.fingerprint,
            state={"dtype": spec.dtype, "state_format": spec.state_format},
            kinds=kinds,
            exclude=self._refused | heads,  # a hot head is that snapshot, loaded
            limit=_CANDIDATES,
        )
        for c in stored:
            found.append((self.cost.ms(c.tier, c.size_bytes, len(ids) - c.n_tokens), c.n_tokens, None, c))
        found.sort(key=lambda f: (f[0], -f[1]))
        return [(n, hot, cand) for _, n, hot, cand in found]

    def _refuse(self, cand: Candidate, e: SnapshotError | NotFound) -> None:
        """A candidate that could not be loaded: a damaged one the store has dropped already; one intact but
        unusable here (another dtype, a format the candidates' metadata did not tell) is never tried again."""
        what = "prefix state" if cand.kind == "prefix" else "snapshot"
        log.warning("%s %s matched the prompt but cannot be used (%s)", what, cand.id, e.message)
        if not isinstance(e, SnapshotError) or isinstance(e, SnapshotCorrupt):
            return
        if cand.kind == "prefix":  # a shared cache entry, not a user's: a usable one replaces it
            try:
                self.store.prefixes.delete(cand.id)
            except NotFound:
                pass
        else:
            self._refused.add(cand.id)

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
