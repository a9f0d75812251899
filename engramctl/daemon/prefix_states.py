"""Prefix states: where a prompt keeps states for conversations that begin like it, and the ones its turns are
computing. Which state a prompt starts from (a prefix state among them) is not decided here: the store's one
lookup (store/candidates.py) finds them beside session snapshots and daemon/state_cache.py `for_prompt` loads one.

    stops = prefixes.stops(messages, prompt_ids, start, opens=..., held_text=...)   # where a prompt keeps states
    claim = prefixes.awaited(ids, start)   # a running turn will keep a longer prefix of ids: wait for it
    prefixes.claim(owner, ids, stops) ... prefixes.offer(ids, state) ... prefixes.ended(owner)

A prompt's prefill stops at the end of its system message(s), at each user message's start and every
engine/boundaries.py INTERVAL_TOKENS (engine/turn.py cuts its chunks there and returns a PrefixState event at
each); the service offers each state here, and the store keeps it (store.prefixes: content-addressed by its
token ids, its KV in the blocks snapshots share, its own byte budget with LRU retention, on disk so it
survives a restart). With a prefix budget of 0 bytes (Settings.prefix_state_bytes) nothing is captured.

Several new conversations that arrive together with a prefix nobody has kept yet compute it once: the first
one's turn claims its stops; a prompt whose ids begin with a claimed, longer prefix than anything kept waits
(the scheduler keeps it queued) until that state is offered, then restores it. A claim ends with its turn
(finished, failed or cancelled before the stop), and whoever waited for it goes on without it.

Keeping a state is off the turn loop: the turn has copied it out of the context (Engine.capture, between two
steps); `offer` hands it to one keeper thread, which flattens it (to_payload, its NaN/Inf scan a pass over every
byte) and commits it to the store (which writes it on its writer thread), beside the prompt's next chunk. Its
claim is released once it is in the store, so a prompt waiting for it finds it there; the turn's end
(`ended`) waits for the states it offered, so a turn that has ended has kept them.

Worker thread only (the scheduler's admission, the service's event handlers), except `counts`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from engramctl.engine.boundaries import INTERVAL_TOKENS, MIN_STOP_TOKENS, prompt_stops
from engramctl.engine.engine import Engine
from engramctl.errors import EngramError
from engramctl.state import SessionState
from engramctl.state.codec import to_payload
from engramctl.store.prefix import token_hash
from engramctl.store.store import Store
from engramctl.store.threads import Workers

log = logging.getLogger("engramctl.daemon")


@dataclass(frozen=True)
class Claim:
    """A running turn will keep the state after ids[:n_tokens]."""

    owner: Hashable
    n_tokens: int
    ids: tuple[int, ...]


class PrefixStates:
    def __init__(self, engine: Engine, store: Store, *, enabled: bool = True):
        self.engine, self.store, self.enabled = engine, store, enabled
        self._claims: dict[str, Claim] = {}  # token hash of the prefix -> the turn computing it
        self._lock = threading.Lock()  # counts() reads from the event loop
        self.restored = 0  # prompts that started from a prefix state (the service counts them)
        self.offered = 0  # states kept
        self._keeping: dict[Hashable, list[concurrent.futures.Future]] = {}  # a turn -> its offers in flight
        if enabled:
            _keeper()  # its thread starts with the service, not inside a turn

    # -- where a prompt keeps states ------------------------------------------------------------------------
    @property
    def capturing(self) -> bool:
        """Are prefix states kept at all (on, and a prefix budget above 0 bytes)?"""
        return self.enabled and self.store.retention.prefix_budget() > 0

    def stops(
        self, messages: Sequence[dict] | None, ids: Sequence[int], start: int, *, opens: bool, held_text: str = ""
    ) -> list[int]:
        """The stops of a prompt (`ids`: all of it; its state holds the first `start`, whose text is `held_text`
        when it has one) past `start`; `opens`: it starts a conversation (an empty state or a prefix state), so
        it stops at intervals too. A stop whose state is kept already is one the prompt would have started from
        (or past), so none is."""
        if not self.capturing or len(ids) <= start:
            return []
        tok = self.engine.tokenizer
        if opens:
            return prompt_stops(tok, messages, ids, start, INTERVAL_TOKENS, held_text)
        # A conversation going on from its own snapshot: its reply snapshot is already (a token or two short of)
        # the next message's start, which any prompt continuing it finds; only later messages' starts are new.
        stops = prompt_stops(tok, messages, ids, start, None, held_text)
        return [n for n in stops if n - start >= MIN_STOP_TOKENS]

    # -- prefixes being computed ---------------------------------------------------------------------------
    def claim(self, owner: Hashable, ids: Sequence[int], stops: Sequence[int]) -> None:
        """`owner`'s turn feeds `ids` and keeps the states at `stops`: prompts beginning alike wait for them."""
        with self._lock:
            for n in stops:
                self._claims.setdefault(token_hash(ids[:n]), Claim(owner, n, tuple(ids[:n])))

    def claimed(self, claim: Claim) -> bool:
        """Is the state `claim` names still to come?"""
        with self._lock:
            return self._claims.get(token_hash(claim.ids)) is claim

    def awaited(self, ids: Sequence[int], start: int) -> Claim | None:
        """The longest prefix of `ids` past `start` tokens that a running turn will keep, if any."""
        if not self.enabled or not self._claims:
            return None
        best = None
        with self._lock:
            claims = list(self._claims.values())
        for c in claims:
            longer = start < c.n_tokens < len(ids) and (best is None or c.n_tokens > best.n_tokens)
            if longer and tuple(ids[: c.n_tokens]) == c.ids:
                best = c
        return best

    def offer(self, ids: Sequence[int], state: SessionState) -> concurrent.futures.Future:
        """A turn's state after ids (a stop of its prompt), copied out of the context: kept in the store by the
        keeper thread, beside the turn's next step, its claim released then. The future's result is the prefix
        state's id (None when it could not be kept: the prompt goes on, later prompts compute it)."""
        ids = tuple(ids)
        key = token_hash(ids)  # before the keeper starts: nothing after the submit competes with it for the GIL
        with self._lock:
            claim = self._claims.get(key)
        job = _keeper().submit(self._keep, ids, state)
        with self._lock:
            if claim is not None:  # the turn's end waits for it (`ended`)
                jobs = self._keeping.setdefault(claim.owner, [])
                jobs[:] = [j for j in jobs if not j.done()] + [job]
        return job

    def _keep(self, ids: tuple[int, ...], state: SessionState) -> str | None:
        try:
            tensors, meta = to_payload(state, self.engine.spec, {})
            pid = self.store.prefixes.put(tensors, meta, list(ids))
        except (EngramError, OSError) as e:  # the prompt goes on without it: a later one computes it again
            log.warning("could not keep the prefix state at %d tokens (%s)", len(ids), e)
            pid = None
        except Exception:  # a keeper thread's failure is logged, never lost
            log.exception("could not keep the prefix state at %d tokens", len(ids))
            pid = None
        finally:
            with self._lock:
                self._claims.pop(token_hash(ids), None)
        if pid is not None:
            with self._lock:
                self.offered += 1
        return pid

    def ended(self, owner: Hashable) -> None:
        """`owner`'s turn ended: the states it offered are kept (waited for), those it had not reached yet will
        not come."""
        with self._lock:
            jobs = self._keeping.pop(owner, [])
        concurrent.futures.wait(jobs)
        with self._lock:
            for key in [k for k, c in self._claims.items() if c.owner == owner]:
                del self._claims[key]

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"claimed": len(self._claims), "kept_since_start": self.offered, "restored": self.restored}


_keeper = Workers(1, "engram-keep")  # the one keeper thread of this process: its jobs run in the order offered
