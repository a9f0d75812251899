"""Conversations: where a turn's state comes from, what gets prefilled, and what gets recorded.

Every method here runs on the worker thread (one at a time), so the in-memory "hot" state needs no lock.

A turn goes: find the state to continue from -> prefill only the new tokens -> capture the prompt
state -> generate, streaming pieces -> (last token sent) settle -> commit the prompt snapshot and the
reply snapshot -> record the transcript. Commits put the payload in a memory tier and queue the disk
write on the store's writer thread, so nothing heavy happens between the last token and the end of
the stream.

Where the state comes from:
- session turn: the hot Live if it is that session's head, else the head snapshot (hottest tier that
  has it), else (no head, corrupt, other model) a re-prefill from the transcript: slower, never lost.
- anonymous turn (a stock OpenAI client resending its history): the request is rendered with the chat
  template and tokenized; the hot Live or the longest stored snapshot whose token ids are an exact
  prefix is restored and only the rest is prefilled. Both the prompt and the reply are snapshotted,
  in an "auto-..." session, so the next request (or the next daemon) finds them.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engramctl.daemon.schemas import Sampling
from engramctl.engine.backend import Live
from engramctl.engine.chat import plan_turn
from engramctl.engine.engine import Engine
from engramctl.engine.generate import Finish
from engramctl.errors import ContextOverflow, NotFound, SnapshotCorrupt, SnapshotError, UsageError
from engramctl.state import SessionState
from engramctl.state.codec import from_payload, to_payload
from engramctl.store.names import validate_label, validate_session_name
from engramctl.store.records import SessionInfo
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")

DEFAULT_MAX_TOKENS = 4096  # when the request gives none: up to this, or what the context has left
AUTO_PREFIX = "auto-"

Emit = Callable[[str, Any], None]


def plain(message: dict) -> dict[str, str]:
    """A message as the chat template and transcript comparisons see it: role and content only."""
    return {"role": str(message.get("role", "")), "content": str(message.get("content") or "")}


def new_turn_messages(request: list[dict], transcript: list[dict]) -> list[dict]:
    """The request's messages past the stored transcript, or all of them if it does not start with it."""
    stored = [plain(m) for m in transcript]
    if stored and request[: len(stored)] == stored:
        return request[len(stored) :]
    return request


@dataclass(frozen=True)
class Turn:
    """A validated chat request, ready for the worker."""

    messages: list[dict]  # plain role/content dicts
    session: str | None
    sampling: Sampling


@dataclass
class Hot:
    """The most recently used conversation's state, kept in memory: it is `session`'s state at `head`."""

    session: str
    head: str | None
    live: Live


@dataclass
class Origin:
    """Where a turn's state came from."""

    tier: str | None = None  # "live" | "vram" | "ram" | "disk" | None (computed from scratch)
    restored_tokens: int = 0
    restore_ms: float | None = None
    parent: str | None = None  # the snapshot the state is (None: new)


@dataclass
class Prepared:
    """A turn whose prompt is in the state, ready to generate."""

    session: str
    live: Live
    origin: Origin
    max_tokens: int
    prompt_tokens: int
    computed_tokens: int
    prefill_ms: float
    prompt_state: SessionState | None  # captured after the prefill (None when nothing was computed)
    new_messages: list[dict] = field(default_factory=list)  # appended with the prompt snapshot
    replace_transcript: list[dict] | None = None  # anonymous turns: the transcript is the request
    before_commit: Callable[[], Any] | None = None  # a restore's head move, applied when recording
    started: float = 0.0  # perf_counter when the worker took the request (for the time to first token)


@dataclass
class TurnResult:
    text: str
    finish_reason: str  # OpenAI's: "stop" | "length"
    usage: dict[str, Any]
    engram: dict[str, Any]


class ConversationService:
    def __init__(self, engine: Engine, store: Store, *, reuse: bool = True, default_max_tokens: int = DEFAULT_MAX_TOKENS):
        self.engine, self.store = engine, store
        self.reuse = reuse  # False only for benchmarks: no hot state, no prefix lookup
        self.default_max_tokens = default_max_tokens
        self.hot: Hot | None = None
        self.turns = 0

    # -- chat ----------------------------------------------------------------------------------------
    def chat(self, turn: Turn, emit: Emit, cancel: threading.Event) -> TurnResult:
        t0 = time.perf_counter()
        if turn.session is not None:
            prepared = self._prepare_session(turn.session, turn.messages, turn.sampling, cancel)
        else:
            prepared = self._prepare_anonymous(turn.messages, turn.sampling, cancel)
        prepared.started = t0
        return self._generate(prepared, turn.sampling, emit, cancel)

    def _prepare_session(self, name: str, messages: list[dict], sampling: Sampling, cancel: threading.Event, *,
                         base: tuple[list[dict], str | None] | None = None,
                         before_commit: Callable[[], Any] | None = None) -> Prepared:  # fmt: skip
        """`base` = (transcript, head) to continue from instead of the session's own (a restore)."""
        validate_session_name(name)
        if base is None:
            try:
                head = self.store.get_session(name).head
                transcript = self.store.transcript(name)
            except NotFound:
                head, transcript = None, []
        else:
            transcript, head = base
        new = new_turn_messages(messages, transcript)
        if not new:
            raise UsageError(
                f"every message in the request is already in session {name!r}'s transcript; send the new message(s).")
        conversation = [plain(m) for m in transcript] + new
        live, origin = self._state_for(name, head, transcript, follow_head=base is None)
        text, reset = plan_turn(self.engine.tokenizer, live.text, conversation, self.engine.prefix_stable)
        if reset:
            log.info("session %s: the chat template is not prefix-stable here; re-prefilling the conversation", name)
            live, origin = self.engine.new_live(), Origin(parent=origin.parent)
        ids = self.engine.tokenizer.encode(text)
        max_tokens = self._room(len(live.token_ids) + len(ids), sampling.requested_max_tokens())
        self._take_hot(live)
        prefill_ms = self._prefill(live, ids, cancel)
        live.text += text
        return Prepared(
            session=name, live=live, origin=origin, max_tokens=max_tokens, prompt_tokens=len(live.token_ids),
            computed_tokens=len(ids), prefill_ms=prefill_ms, prompt_state=self.engine.capture(live),
            new_messages=new, before_commit=before_commit,
        )  # fmt: skip

    def _prepare_anonymous(self, messages: list[dict], sampling: Sampling, cancel: threading.Event) -> Prepared:
        tok = self.engine.tokenizer
        conversation = [plain(m) for m in messages]
        text = tok.render(conversation, add_generation_prompt=True)
        ids = tok.encode(text)
        max_tokens = self._room(len(ids), sampling.requested_max_tokens())
        live, origin, source_session = self._longest_prefix(ids)
        session = source_session if source_session and source_session.startswith(AUTO_PREFIX) else None
        session = session or f"{AUTO_PREFIX}{secrets.token_hex(8)}"
        self._take_hot(live)
        n = len(live.token_ids)
        prefill_ms = self._prefill(live, ids[n:], cancel)
        live.text = text
        return Prepared(
            session=session, live=live, origin=origin, max_tokens=max_tokens, prompt_tokens=len(ids),
            computed_tokens=len(ids) - n, prefill_ms=prefill_ms,
            prompt_state=self.engine.capture(live) if len(ids) > n else None, replace_transcript=conversation,
        )  # fmt: skip

    def _longest_prefix(self, ids: list[int]) -> tuple[Live, Origin, str | None]:
        if not self.reuse:
            return self.engine.new_live(), Origin(), None
        hot = self.hot
        if hot is not None and 0 < len(hot.live.token_ids) <= len(ids) and hot.live.token_ids == ids[: len(hot.live.token_ids)]:
            return hot.live, Origin("live", len(hot.live.token_ids), 0.0, hot.head), hot.session
        for _ in range(4):  # an unusable match is dropped by the store (corrupt) or skipped: look again
            hit = self.store.find_prefix(ids, self.engine.info.fingerprint)
            if hit is None:
                break
            rec, n = hit
            try:
                live, tier, ms = self._load(rec.id)
                return live, Origin(tier, n, ms, rec.id), rec.session
            except (SnapshotError, NotFound) as e:
                log.warning("snapshot %s matched the prompt but cannot be used (%s)", rec.id, e.message)
                if isinstance(e, SnapshotError) and not isinstance(e, SnapshotCorrupt):
                    break  # intact but unusable (another dtype, say): it would match again
        return self.engine.new_live(), Origin(), None

    def _generate(self, p: Prepared, sampling: Sampling, emit: Emit, cancel: threading.Event) -> TurnResult:
        params = sampling.sampling_params(p.max_tokens)
        ext = self._ext(p)
        emit("start", dict(ext))
        prompt_text = p.live.text
        gen_start = time.perf_counter()
        gen = self.engine.generate(p.live, params, cancel)
        for piece in gen:
            emit("piece", piece)
        finish: Finish = gen.finish  # type: ignore[assignment]
        # The last token is on its way to the client; from here on nothing delays it.
        self.engine.settle(p.live, gen)
        # The state keeps the generated tokens as generated. Its text is what the transcript will
        # render for them (the reply as shown, plus the end-of-turn token if it stopped on one), so the
        # next turn's render extends it and only the new messages get tokenized; the reply's tokens
        # are never re-tokenized, even when their text would not round-trip (partial UTF-8, a stop
        # string cut from the reply).
        p.live.text = prompt_text + finish.text + self._eos_text(finish)
        snapshot_id = self._record(p, finish)
        self.turns += 1
        ext.update(
            snapshot_id=snapshot_id, finish_reason=finish.reason, completion_tokens=len(finish.token_ids),
            ttft_ms=None if finish.ttft_s is None else round((gen_start - p.started + finish.ttft_s) * 1000, 2),
            decode_ms=round(finish.decode_s * 1000, 2),
        )  # fmt: skip
        usage = {
            "prompt_tokens": p.prompt_tokens,
            "completion_tokens": len(finish.token_ids),
            "total_tokens": p.prompt_tokens + len(finish.token_ids),
            "prompt_tokens_details": {"cached_tokens": p.prompt_tokens - p.computed_tokens},
        }
        reason = "length" if finish.reason == "cancelled" else finish.reason
        return TurnResult(text=finish.text, finish_reason=reason, usage=usage, engram=ext)

    def _ext(self, p: Prepared) -> dict[str, Any]:
        """The `engram` extension object of the first chunk; the last one adds the outcome."""
        return {
            "session": p.session,
            "resumed": p.origin.restored_tokens > 0,
            "restored_tokens": p.origin.restored_tokens,
            "tier": p.origin.tier,
            "restore_ms": p.origin.restore_ms,
            "snapshot_id": None,
            "prompt_tokens": p.prompt_tokens,
            "cached_tokens": p.prompt_tokens - p.computed_tokens,
            "computed_tokens": p.computed_tokens,
            "prefill_ms": round(p.prefill_ms, 2),
        }

    def _record(self, p: Prepared, finish: Finish) -> str | None:
        """Snapshot the prompt and the reply, record the transcript, keep the state hot. Failing to
        snapshot never loses the conversation: the transcript is recorded regardless."""
        reply = {"role": "assistant", "content": finish.text, "finish_reason": finish.reason}
        unrecorded = list(p.new_messages) + [reply]
        head = p.origin.parent
        try:
            if p.before_commit is not None:
                p.before_commit()
            if p.replace_transcript is not None:
                self.store.set_transcript(p.session, p.replace_transcript)
            if p.prompt_state is not None:
                rec = self.store.commit(p.session, self._payload(p.prompt_state, "prompt"), parent=head,
                                        messages=unrecorded[:-1])  # fmt: skip
                head, unrecorded = rec.id, unrecorded[-1:]
            rec = self.store.commit(p.session, self._payload(self.engine.capture(p.live), "reply"), parent=head,
                                    messages=unrecorded)  # fmt: skip
            head, unrecorded = rec.id, []
            self.hot = Hot(p.session, head, p.live) if self.reuse else None
            return head
        except Exception as e:  # noqa: BLE001 - a snapshot failure must not lose the turn
            log.error("session %s: could not snapshot the turn (%s); the transcript keeps it", p.session, e)
            self.hot = None
            if unrecorded:
                try:
                    self.store.append_messages(p.session, unrecorded)
                except Exception as e2:  # noqa: BLE001
                    log.error("session %s: could not record the transcript either: %s", p.session, e2)
            return None

    # -- snapshot routes -----------------------------------------------------------------------------
    def restore(self, snapshot_ref: str | None, session: str | None, continuation: dict | None,
                sampling: Sampling, emit: Emit, cancel: threading.Event) -> dict | TurnResult:  # fmt: skip
        """Make a snapshot (or a session's head) the state a session continues from and load it into
        memory; with a continuation message, generate from there."""
        if snapshot_ref is not None:
            sid = self.store.resolve(snapshot_ref)
            rec = self.store.info(sid)
            target = session or rec.session
            exists = self._session_exists(target)
            if session is not None and not exists:
                before: Callable[[], Any] | None = lambda: self.store.branch(sid, target)  # noqa: E731
            else:
                before = lambda: self.store.set_head(target, sid)  # noqa: E731
            transcript, head = self.store.snapshot_transcript(sid), sid
        else:
            assert session is not None
            target, before = session, None
            head = self.store.get_session(session).head
            transcript = self.store.transcript(session)
        if continuation is not None:
            t0 = time.perf_counter()
            p = self._prepare_session(target, [continuation], sampling, cancel, base=(transcript, head),
                                      before_commit=before)  # fmt: skip
            p.started = t0
            return self._generate(p, sampling, emit, cancel)
        hot = self.hot
        if head is None:
            live, origin = self.engine.new_live(), Origin()
        elif hot is not None and hot.session == target and hot.head == head:
            live, origin = hot.live, Origin("live", len(hot.live.token_ids), 0.0, head)
        else:
            live, tier, ms = self._load(head)  # an unusable snapshot is an error here, not a fallback
            origin = Origin(tier, len(live.token_ids), ms, head)
        if before is not None:
            before()
        if head is not None and self.reuse:
            self.hot = Hot(target, head, live)
        return {
            "success": True, "session": target, "conversation_id": target, "snapshot_id": head,
            "tokens": len(live.token_ids), "tier": origin.tier, "restore_ms": origin.restore_ms,
            "n_messages": len(transcript),
        }  # fmt: skip

    def save(self, session: str, label: str | None, pin: bool) -> str:
        """Pin (and label) the session's head; a session without one is re-prefilled from its
        transcript and snapshotted first. Returns the snapshot id."""
        if label is not None:
            validate_label(label)
        info = self.store.get_session(session)
        head = info.head
        if head is None:
            transcript = [plain(m) for m in self.store.transcript(session)]
            if not transcript:
                raise UsageError(f"session {session!r} has no conversation to snapshot yet.")
            live = self.engine.new_live()
            text = self.engine.tokenizer.render(transcript, add_generation_prompt=False)
            ids = self.engine.tokenizer.encode(text)
            self.engine.check_context(len(ids))
            self._prefill(live, ids, threading.Event())
            live.text = text
            head = self.store.commit(session, self._payload(self.engine.capture(live), "saved")).id
            if self.reuse:
                self.hot = Hot(session, head, live)
        if label is not None:
            self.store.label(head, label)
        if pin:
            self.store.pin(head)
        return head

    # -- state ---------------------------------------------------------------------------------------
    def _state_for(self, session: str, head: str | None, transcript: list[dict], *,
                   follow_head: bool = True) -> tuple[Live, Origin]:  # fmt: skip
        """The session's state at `head`: hot, else loaded; a fresh one when there is none or it is
        unusable (the caller then prefills whatever the state lacks). A corrupt head is dropped by the
        store and the session falls back to its parent: with follow_head we try that one next."""
        hot = self.hot
        if self.reuse and hot is not None and head is not None and hot.session == session and hot.head == head:
            return hot.live, Origin("live", len(hot.live.token_ids), 0.0, head)
        for _ in range(4):
            if head is None:
                break
            try:
                live, tier, ms = self._load(head)
                return live, Origin(tier, len(live.token_ids), ms, head)
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

    def _load(self, snapshot_id: str) -> tuple[Live, str | None, float]:
        t0 = time.perf_counter()
        rec = self.store.info(snapshot_id)
        tier = rec.tiers[0] if rec.tiers else "ram"  # no tier yet = committed, still in memory
        tensors, meta = self.store.load(snapshot_id)
        live = self.engine.inject(from_payload(tensors, meta, self.engine.spec))
        return live, tier, round((time.perf_counter() - t0) * 1000, 2)

    def _take_hot(self, live: Live) -> None:
        """`live` is about to change: if it is the hot state, it stops being a valid copy of its head."""
        if self.hot is not None and self.hot.live is live:
            self.hot = None

    def _prefill(self, live: Live, ids: list[int], cancel: threading.Event) -> float:
        """Feed `ids`, checking for cancellation between chunks. Returns milliseconds."""
        t0 = time.perf_counter()
        if ids:
            self.engine.backend.prefill(live, ids, cancel)
        return (time.perf_counter() - t0) * 1000

    def _room(self, prompt_tokens: int, requested: int | None) -> int:
        """max_tokens for the reply; ContextOverflow when the prompt (plus requested) does not fit."""
        ctx = self.engine.info.context_length
        if ctx is None:
            return requested or self.default_max_tokens
        if prompt_tokens >= ctx:
            raise ContextOverflow(
                f"the conversation needs {prompt_tokens} tokens; the model's context is {ctx} tokens.",
                hint="start a new session, or branch from an earlier snapshot",
            )
        room = ctx - prompt_tokens
        if requested is not None and requested > room:
            raise ContextOverflow(
                f"the prompt takes {prompt_tokens} tokens and max_tokens={requested} would go past the model's "
                f"context of {ctx} tokens.",
                hint=f"ask for at most {room} tokens",
            )
        return requested or min(self.default_max_tokens, room)

    def _eos_text(self, finish: Finish) -> str:
        tok = self.engine.tokenizer
        if finish.reason == "stop" and finish.token_ids and finish.token_ids[-1] in tok.eos_ids:
            return tok.decode([finish.token_ids[-1]], skip_special=False)
        return ""

    def _payload(self, state: SessionState, stage: str):
        return to_payload(state, self.engine.spec, {"stage": stage})

    def _session_exists(self, name: str) -> bool:
        try:
            self.store.get_session(name)
            return True
        except NotFound:
            return False

    def reset(self, session: str) -> tuple[str | None, SessionInfo]:
        """Start the session over (no state, empty transcript) and drop its hot state; its snapshots
        are kept, each with the transcript it was taken at. Returns (previous head, SessionInfo)."""
        previous = self.store.get_session(session).head
        info = self.store.reset_session(session)
        self.invalidate(session)
        return previous, info

    def invalidate(self, session: str | None = None) -> None:
        """Forget the hot state (of `session`, or whichever)."""
        if self.hot is not None and (session is None or self.hot.session == session):
            self.hot = None
