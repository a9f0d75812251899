"""Conversations: what a turn is (its plan), what happens as it runs, and what it leaves (its record).

Every method here but `invalidate` runs on the worker thread. A request goes:
1. which state continues it (state_cache.py): a hot Live, a snapshot, a prefix state, or a fresh state;
2. the turn plans (refusing a prompt that does not fit, touching nothing) and comes back as a
   sequence.Sequence, which the scheduler steps with the other turns: prefill only the new
   tokens -> generate, streaming pieces -> settle -> capture;
3. each event the turn returns comes here, to `handle`, one arm per event: the stream's start, its pieces and
   its last choice go to the route (the job's events); the prompt snapshot is committed once the first token is
   on its way; at the end (TurnDone) the reply snapshot and the transcript are recorded (recorder.py) and the
   reply state stays hot.

Its result is one TurnResult (turn_result.py), built there from the engine's outcome as the turn goes:
emitted at `start` and `finish`, and the recorded one is the job's result; the doors write their JSON from
it (turn_json.py for the fields every API reports). Restoring and saving a session's state are the Engram
API's (engram_api/restore.py): a restore with a continuation is a turn here (`turn_from`), and the Engram
API's restore-and-generate (engram_api/continuation.py) plans its own through `plan_turn` and `sequence`,
as every turn here does. A request run outside the daemon (the benchmark) runs its Sequence alone:
`service.run(service.chat(...))`.
"""

from __future__ import annotations

import collections
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable

from engramctl.daemon import turn_result
from engramctl.daemon.job import Deferred, Failed, Job
from engramctl.daemon.prefix_states import PrefixStates
from engramctl.daemon.recorder import Recorder, TurnRecord
from engramctl.daemon.scheduler import Scheduler
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.state_cache import Hot, Origin, StateCache
from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine
from engramctl.engine.generate import Piece
from engramctl.engine.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams
from engramctl.engine.turn import (
    Event,
    Finished,
    PrefixState,
    PromptState,
    Started,
    Turn,
    TurnDone,
    reply_budget,
)
from engramctl.errors import NotFound, UsageError
from engramctl.store.crashpoints import crash_point
from engramctl.store.names import validate_session_name
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

AUTO_PREFIX = "auto-"


def plain(message: dict) -> dict[str, str]:
    """A message as the chat template and transcript comparisons see it: role and content only."""
    return {"role": str(message.get("role", "")), "content": str(message.get("content") or "")}


def new_turn_messages(request: list[dict], transcript: list[dict]) -> list[dict]:
    """The request's messages past the stored transcript, or all of them if it does not start with it."""
    stored = [plain(m) for m in transcript]
    if stored and request[: len(stored)] == stored:
        return request[len(stored) :]
    return request


def unanswered(transcript: list[dict]) -> list[dict]:
    """The transcript's last user messages when no reply follows them: a turn that never finished (the
    daemon was killed mid-reply, or the session was branched while the turn ran)."""
    stored = [plain(m) for m in transcript]
    n = len(stored)
    while n and stored[n - 1]["role"] == "user":
        n -= 1
    return stored[n:]


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]  # plain role/content dicts
    session: str | None  # None: a client resending its whole history (the prefix path)
    params: SamplingParams


@dataclass(frozen=True)
class CompletionRequest:
    ids: list[int]  # the prompt's token ids, in full
    text: str  # the text they encode
    params: SamplingParams


class ConversationService:
    def __init__(
        self,
        engine: Engine,
        store: Store,
        *,
        reuse: bool = True,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        keep: int = 1,
    ):
        self.engine, self.store = engine, store
        self.reuse = reuse  # False only for benchmarks: no hot state, no prefix lookup
        self.default_max_tokens = default_max_tokens
        self.states = StateCache(engine, store, reuse=reuse, keep=keep)  # `keep` hot states
        self.recorder = Recorder(engine, store)
        self.turns = 0
        self.in_flight: collections.Counter[str] = collections.Counter()  # session -> turns planned, not ended
        # the states kept where conversations diverge; none for a Mamba1 model, which resumes token by token
        self.prefixes = PrefixStates(engine, store, enabled=reuse and engine.info.resume != "token_by_token")

    @property
    def hot(self) -> Hot | None:
        """The most recently used conversation's hot state."""
        return self.states.current

    # -- chat ----------------------------------------------------------------------------------------
    def chat(self, req: ChatRequest, job: Job | None = None) -> Sequence:
        t0 = time.perf_counter()
        self.states.release_retired()
        if req.session is None:
            return self._anonymous(req.messages, req.params, job, t0)
        return self.turn_from(req.session, req.messages, req.params, job, t0)

    def turn_from(
        self,
        name: str,
        messages: list[dict],
        params: SamplingParams,
        job: Job | None,
        t0: float,
        *,
        base: tuple[list[dict], str | None] | None = None,
        before_commit: Callable[[], Any] | None = None,
    ) -> Sequence:
        """A turn of session `name`; `base` = (transcript, head) to continue from instead of the session's own
        (a restore: engram_api/restore.py), `before_commit` what makes that restore stick."""
        validate_session_name(name)
        transcript, head = base if base is not None else self._transcript_and_head(name)
        new = new_turn_messages(messages, transcript)
        asked = unanswered(transcript) if base is None else []
        if asked and [plain(m) for m in new] in ([], asked):  # asked again: answered from the state holding them
            new = []
        elif not new:
            raise UsageError(
                f"every message in the request is already in session {name!r}'s transcript; send the new message(s)."
            )
        elif asked and head is not None:  # something else: they stay, read again from the state before them
            head = self._before_unanswered(head, len(transcript))
        conversation = [plain(m) for m in transcript] + new
        found = self.states.for_session(name, head, transcript, follow_head=base is None)
        budget = self.default_max_tokens
        if found is None and self.prefixes.enabled:  # no state of its own yet: a prefix state holding its start
            text, ids = self._rendered(conversation)
            live, origin, _ = self._start(ids, conversations=False)
            turn = self.plan_turn(
                live, origin, lambda: Turn.for_tokens(self.engine, live, ids, text, params, default_max_tokens=budget)
            )
        else:
            live, origin = found if found is not None else (self.engine.new_live(), Origin())
            turn = self.plan_turn(
                live,
                origin,
                lambda: Turn.for_messages(self.engine, live, conversation, params, default_max_tokens=budget),
            )
        if turn.reset:
            log.info("session %s: the chat template is not prefix-stable here; re-prefilling the conversation", name)
            origin = Origin(parent=origin.parent)
        record = TurnRecord(name, origin.parent, new, before_commit=before_commit)
        return self.sequence(turn, name, origin, record, job, t0, conversation)

    def complete(self, req: CompletionRequest, job: Job | None = None) -> Sequence:
        """A raw prompt (/v1/completions, Ollama's generate): the anonymous path, on the prompt's own ids."""
        t0 = time.perf_counter()
        self.states.release_retired()
        conversation = [{"role": "user", "content": req.text}]
        return self._prefix(req.ids, req.text, conversation, req.params, job, t0, raw=True)

    def _anonymous(self, messages: list[dict], params: SamplingParams, job: Job | None, t0: float) -> Sequence:
        conversation = [plain(m) for m in messages]
        text, ids = self._rendered(conversation)
        return self._prefix(ids, text, conversation, params, job, t0)

    def _rendered(self, conversation: list[dict]) -> tuple[str, list[int]]:
        """The whole conversation as the chat template renders it for a reply, and its token ids (a text too long
        for the context whatever it tokenizes to is refused before tokenizing: Engine.check_text)."""
        text = self.engine.tokenizer.render(conversation, add_generation_prompt=True)
        self.engine.check_text(text)
        return text, self.engine.tokenizer.encode(text)

    def _prefix(
        self,
        ids: list[int],
        text: str,
        conversation: list[dict],
        params: SamplingParams,
        job: Job | None,
        t0: float,
        *,
        raw: bool = False,
    ) -> Sequence:
        """A turn on `ids` from the state holding a prefix of them that is cheapest to start from
        (StateCache.for_prompt)."""
        budget = self.default_max_tokens
        reply_budget(self.engine, len(ids), params.max_tokens, budget)  # refuse before looking anything up
        live, origin, source = self._start(ids, conversations=True)
        turn = self.plan_turn(
            live, origin, lambda: Turn.for_tokens(self.engine, live, ids, text, params, default_max_tokens=budget)
        )
        session = source if self._continues(source, origin, conversation) else f"{AUTO_PREFIX}{secrets.token_hex(8)}"
        record = TurnRecord(session, origin.parent, [], replace_transcript=conversation)
        return self.sequence(turn, session, origin, record, job, t0, None if raw else conversation)

    def _start(self, ids: list[int], *, conversations: bool) -> tuple[Live, Origin, str | None]:
        """The state a prompt of `ids` starts from (StateCache.for_prompt decides), once no running turn is
        computing a longer prefix of them than any state holds: a prompt that would wait for one raises
        Deferred (the scheduler keeps it queued), not to compute it a second time."""

        def unless_computing(held: int) -> None:
            claim = self.prefixes.awaited(ids, held)
            if claim is not None:
                raise Deferred(
                    f"waiting for the state after {claim.n_tokens} tokens another turn is computing",
                    lambda: not self.prefixes.claimed(claim),
                )

        live, origin, source = self.states.for_prompt(
            ids, conversations=conversations, prefixes=self.prefixes.enabled, wait=unless_computing
        )
        if origin.prefix:
            self.prefixes.restored += 1
        return live, origin, source

    def _continues(self, source: str | None, origin: Origin, conversation: list[dict]) -> bool:
        """Does an anonymous turn record into the auto session whose state it continues? Only when it goes on
        from where that session stands (from its head, or with messages that extend its transcript: a resent
        reply may tokenize otherwise) and no other turn of it is in flight. A fork (a regenerate, an edited
        message, another client whose conversation began alike) or two at once each get a session of their
        own, so no transcript mixes two conversations and no client's snapshots age out under another's."""
        if not source or not source.startswith(AUTO_PREFIX) or self.in_flight[source]:
            return False
        try:
            if self.store.sessions.get(source).head == origin.parent:
                return True
            stored = [plain(m) for m in self.store.transcripts.of_session(source)]
        except NotFound:
            return False
        return len(conversation) > len(stored) and [plain(m) for m in conversation[: len(stored)]] == stored

    def plan_turn(self, live: Live, origin: Origin, make: Callable[[], Turn]) -> Turn:
        """Plan the turn, then take its Live from the hot state (the turn changes it). A refused turn
        leaves a hot Live hot and releases one loaded for it."""
        try:
            turn = make()
        except BaseException:
            self.states.give_back(live, origin)
            raise
        self.states.take(live)
        return turn

    def sequence(
        self,
        turn: Turn,
        session: str,
        origin: Origin,
        record: TurnRecord,
        job: Job | None,
        t0: float,
        messages: list[dict] | None = None,
    ) -> Sequence:
        """The planned turn as the scheduler steps it (its events come to `handle`). Its prefill stops where the
        prompt's `messages` begin (None: a raw prompt) and, for a prompt that starts a conversation, at intervals,
        to keep the states there (daemon/prefix_states.py)."""
        self.in_flight[session] += 1
        seq = Sequence(turn, session, origin, record, t0, job)
        held = [] if turn.reset else turn.live.token_ids
        opens = origin.parent is None  # from nothing or a prefix state, not a snapshot of a conversation
        ids = [*held, *turn.feed]
        held_text = "" if turn.reset else turn.live.text
        stops = self.prefixes.stops(messages, ids, len(held), opens=opens, held_text=held_text)  # in the fed part
        if stops:
            turn.stops = sorted({*turn.stops, *stops})
            self.prefixes.claim(seq, ids, turn.stops)
        return seq

    # -- a turn's events: the scheduler's steps return them, the worker hands each here -------------------
    def handle(self, seq: Sequence, event: Event | Failed) -> Any:
        """What one event of `seq`'s turn does. Its start is emitted once the prompt is in the state, the prompt
        snapshot committed once the first token is on its way (its file is written while the reply is
        generated), its pieces emitted, its last choice as soon as generation stops; at its end the turn is
        recorded, its state kept hot, and the job's result returned (the worker finishes the job with it)."""
        match event:
            case Started(prompt=prompt):
                self.states.cost.prefilled(prompt.computed_tokens, prompt.prefill_ms)
                seq.result = turn_result.started(seq.session, seq.origin, prompt, seq.started_at)
                seq.emit("start", seq.result)
            case Piece():
                crash_point("stream.piece")
                seq.emit("piece", event)
            case PromptState(prompt=prompt):
                self.recorder.prompt(seq.record, prompt)
            case PrefixState(token_ids=ids, state=state):
                self.prefixes.offer(ids, state)
            case Finished(finish=finish):
                seq.result = turn_result.finished(seq.result, finish)
                seq.emit("finish", seq.result)  # the stream's last choice: it does not wait for the reply state
            case TurnDone():
                try:
                    self.recorder.turn(seq.record, event)
                    self.states.keep(seq.session, seq.record.reply_id, event.live)
                finally:
                    self._ended(seq)
                self.turns += 1
                so_far = seq.result or turn_result.started(seq.session, seq.origin, event.prompt, seq.started_at)
                seq.result = turn_result.recorded(so_far, event, seq.record)
                return seq.result if seq.answer is None else seq.answer(seq.result)
            case Failed():
                self._ended(seq)
                self.states.release_retired()
        return None

    def run(self, seq: Sequence) -> Any:
        """Run one planned turn alone, on this thread (the benchmark; tests): its result, or its error raised."""
        scheduler = Scheduler(self.engine, max_sequences=1)
        scheduler.start(seq)
        end: tuple[Any, BaseException | None] | None = None
        while scheduler.busy:
            for _, event in scheduler.step():
                try:
                    result = self.handle(seq, event)
                except BaseException as e:  # noqa: BLE001 - as the worker: the turn fails with it
                    if isinstance(event, (TurnDone, Failed)):
                        end = (None, event.error if isinstance(event, Failed) else e)
                    else:
                        seq.error = e  # the scheduler drops the turn before its next step
                    continue
                if isinstance(event, Failed):
                    end = (None, event.error)
                elif isinstance(event, TurnDone):
                    end = (result, None)
        if end is None:
            raise RuntimeError("the turn ended without its end")  # unreachable: it ends with TurnDone or Failed
        if end[1] is not None:
            raise end[1]
        return end[0]

    def _ended(self, seq: Sequence) -> None:
        self.prefixes.ended(seq)
        self.in_flight[seq.session] -= 1
        if self.in_flight[seq.session] <= 0:
            del self.in_flight[seq.session]

    # -- sessions ------------------------------------------------------------------------------------
    def invalidate(self, session: str | None = None) -> None:
        """Forget the hot state (of `session`, or whichever). Any thread: the worker releases it later."""
        self.states.drop(session)

    def _before_unanswered(self, head: str, n_messages: int) -> str | None:
        """The state to continue from instead of `head` when it holds the unanswered messages' prompt
        (the generation prompt at its end would make the template re-read everything): its parent."""
        try:
            rec = self.store.snapshots.info(head)
        except NotFound:
            return head
        return rec.parent if rec.n_messages == n_messages else head

    def _transcript_and_head(self, name: str) -> tuple[list[dict], str | None]:
        try:
            head = self.store.sessions.get(name).head
            return self.store.transcripts.of_session(name), head
        except NotFound:
            return [], None
