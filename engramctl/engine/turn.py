"""One chat turn, the only place it is written: the daemon's scheduler and the benchmark both run it.

    turn = Turn.for_messages(engine, live, messages, params)   # plans; refuses touching nothing
    done = turn.run(cancel)                                     # alone: the TurnDone
    for event in turn.events(cancel): ...                       # alone, hearing each event as it happens

A turn is a state machine that says what happened by returning events, and calls nobody back:

    begin(cancel)                   it owns its Live from here on
    work(room) -> tokens            what the next step feeds it: a prompt chunk, the token just sampled, the
                                    last one to settle ([] when the prompt is in with nothing to feed)
    (the caller feeds them: Engine.step, one turn alone or many together)
    fed() -> events                 read them all: the turn moves on as they are read

The events, in order: `PrefixState` at each of the caller's `stops` during the prefill; `Started` once the
prompt is in the state (Prompt.state None yet); the first token's text `Piece`s; `PromptState` (the prompt
state, captured after the first token's text was handed on: the copy does not delay it); more `Piece`s;
`Finished` as soon as generation stops (before the reply state is settled and captured); `TurnDone` last.
Running alone (`run`, `events`) and stepped by the daemon's scheduler with other turns, a turn computes the
same tokens: the scheduler's step is this loop over many turns.

A turn starts from a live state the caller chose (hot, restored from a snapshot, or new) and either
the whole conversation (the chat template's render past what the state consumed is fed) or the
prompt's token ids (a stock OpenAI client's request, when the state holds a prefix of them). It ends
with the prompt state, the reply and the reply state. Where the state came from and what gets
recorded afterwards (snapshots, transcript) is the caller's.

Ownership: `begin()` (and `run()`) owns the Live it is given. It releases it when the chat template forces a fresh
state, and when the turn fails half-way (a cancelled prefill leaves it half-fed: `abort`); the Live in its
TurnDone is the caller's. Planning (the constructors) changes nothing, so a refused turn leaves the state usable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

from engramctl.engine.backend import Live
from engramctl.engine.chat import plan_turn
from engramctl.engine.engine import Engine
from engramctl.engine.generate import Finish, Piece, Reply
from engramctl.engine.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams
from engramctl.errors import Cancelled, ContextOverflow, EngramError
from engramctl.state import SessionState


@dataclass(frozen=True)
class Prompt:
    """The prompt is in the state: what that took."""

    prompt_tokens: int  # tokens of the conversation so far (what the state holds now)
    computed_tokens: int  # tokens run through the model for it this turn
    reset: bool  # the chat template was not prefix-stable here: the state started over
    max_tokens: int  # the reply's budget: the request's, or what the context has room for
    prefill_ms: float
    state: SessionState | None  # captured after the prefill; None when nothing was computed (or capture=False)
    loaded: tuple[str, float] | None = None  # the state was loaded back during the prefill (Engine.take_load)

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.computed_tokens


@dataclass(frozen=True)
class TurnDone:
    """A finished turn. The marks are time.perf_counter() values, for callers timing it from their own start."""

    prompt: Prompt
    finish: Finish  # how it ended, every generated token, the reply as shown
    live: Live  # the state after the reply: every reply token consumed, its text what a transcript renders
    reply_state: SessionState | None  # captured after settling (None with capture=False)
    first_token_at: float | None  # the first token was sampled (None: none was)
    last_token_at: float  # generation stopped: the last token is on its way to the client
    settle_ms: float  # feeding the last sampled token, after the last token was sent
    capture_ms: float  # copying the reply state

    @property
    def decode_ms(self) -> float:
        return self.finish.decode_s * 1000


@dataclass(frozen=True)
class Started:
    """The prompt is in the state (its state not captured yet): a stream's first chunk."""

    prompt: Prompt


@dataclass(frozen=True)
class PromptState:
    """The prompt state, captured once the first token's text was handed on (`prompt.state`; None when
    nothing was computed for the prompt, or the turn does not capture)."""

    prompt: Prompt


@dataclass(frozen=True)
class PrefixState:
    """The state after the prompt's first `n_tokens` (one of the turn's `stops`), captured during the prefill."""

    n_tokens: int
    token_ids: tuple[int, ...]  # what the state holds: n_tokens ids
    state: SessionState  # Engine.capture's, as a prompt state is


@dataclass(frozen=True)
class Finished:
    """Generation stopped: the reply's last token is on its way; the reply state is settled and captured next."""

    finish: Finish


# What a turn's steps return; a Piece is a str (generate.Piece: a piece of reply text with its logprob entries).
Event = Union[PrefixState, Started, Piece, PromptState, Finished, TurnDone]


def reply_budget(
    engine: Engine, prompt_tokens: int, requested: int | None, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> int:
    """max_tokens for the reply; ContextOverflow when the prompt (plus the requested reply) does not fit."""
    ctx = engine.info.context_length
    if ctx is None:
        return requested or default_max_tokens
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
    return requested or min(default_max_tokens, room)


class Turn:
    """A planned turn: what to feed, and the reply's budget. Build it with for_messages / for_tokens.

    `stops`: token counts of the state (absolute, e.g. [256, 512]) where a prefill chunk must end and the turn
    captures the state (a PrefixState event); chunks are otherwise cut as without them. Stops at or below what
    the state holds when the turn starts, or at or past the prompt's end, are ignored."""

    def __init__(
        self,
        engine: Engine,
        live: Live,
        feed: list[int],
        text: str,
        reset: bool,
        params: SamplingParams,
        default_max_tokens: int,
        capture: bool,
        stops: Sequence[int] = (),
    ):
        self.engine, self.live, self.feed, self.text, self.reset = engine, live, feed, text, reset
        start = 0 if reset else len(live.token_ids)
        self.prompt_tokens = start + len(feed)
        self.max_tokens = reply_budget(engine, self.prompt_tokens, params.max_tokens, default_max_tokens)
        self.params = dataclasses.replace(params, max_tokens=self.max_tokens)
        self.capture = capture
        self.stops = sorted({int(n) for n in stops if start < n < self.prompt_tokens})
        self.done: TurnDone | None = None  # the turn's end, once it has one

    @classmethod
    def for_messages(
        cls,
        engine: Engine,
        live: Live,
        messages: list[dict],
        params: SamplingParams,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        capture: bool = True,
        stops: Sequence[int] = (),
    ) -> "Turn":
        """The whole conversation (plain role/content dicts, ending with the new message): only the
        template's render past the state's consumed text is fed, or all of it when the template is not
        prefix-stable there."""
        text, reset = plan_turn(engine.tokenizer, live.text, messages, engine.prefix_stable)
        engine.check_text(text)
        full = text if reset else live.text + text
        ids = engine.tokenizer.encode(text)
        return cls(engine, live, ids, full, reset, params, default_max_tokens, capture, stops)

    @classmethod
    def for_tokens(
        cls,
        engine: Engine,
        live: Live,
        ids: list[int],
        text: str,
        params: SamplingParams,
        *,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        capture: bool = True,
        stops: Sequence[int] = (),
    ) -> "Turn":
        """The prompt's token ids and the text they encode; `live` holds a prefix of them."""
        n = len(live.token_ids)
        if live.token_ids != ids[:n]:
            raise EngramError("the state's tokens are not a prefix of the prompt's; it cannot continue to it.")
        return cls(engine, live, ids[n:], text, False, params, default_max_tokens, capture, stops)

    # -- stepping: the daemon's scheduler runs many turns one step at a time, `run` runs one alone ---------
    def begin(self, cancel: threading.Event | None = None) -> None:
        """Start the turn: from here on it owns its Live (`abort` releases it). `cancel` ends the generation
        at its next token (finish reason "cancelled"); the prefill's caller checks it between chunks."""
        self.cancel = cancel or threading.Event()
        self._left, self._chunk, self._next = list(self.feed), [], None
        self._stops = list(self.stops)
        self.shared_tokens = 0  # the prompt's first tokens taken from another conversation's cells (share_prefix)
        self._reply: Reply | None = None
        self._finish: Finish | None = None
        self.done: TurnDone | None = None
        if self.reset:
            self.engine.release(self.live)
            self.live = self.engine.new_live()
        self.engine.take_load(self.live)  # only the loads of this turn's steps count
        self._t0 = time.perf_counter()

    @property
    def prefilling(self) -> bool:
        return bool(self._left)

    def share_prefix(self) -> None:
        """Before the first chunk of a prompt fed to an empty state: start from the cells of another
        conversation that begins the same way (Engine.share_prefix), so only the rest is computed. The
        scheduler asks only when other turns run (a turn alone computes its whole prompt, as it always did);
        the last token is always computed, for the logits. A stop the shared cells pass is not captured."""
        ids = self._may_share()
        if ids:
            n = self.engine.share_prefix(self.live, ids)
            self._left, self.shared_tokens = self._left[n:], n

    def shareable(self) -> int:
        """The prompt tokens share_prefix would take from another conversation now (0: none)."""
        ids = self._may_share()
        return self.engine.shareable_prefix(self.live, ids) if ids else 0

    def _may_share(self) -> list[int]:
        """The prompt tokens another conversation's cells may stand in for: while nothing is fed (nor shared)
        yet, all but the last, which is computed for its logits."""
        return self._left[:-1] if self._left and not self.live.token_ids else []

    @property
    def prompt_left(self) -> int:
        """Prompt tokens not fed yet."""
        return len(self._left)

    def work(self, room: int | None = None) -> list[int]:
        """The tokens the next step feeds this turn's Live: a prompt chunk (at most `room` tokens where the
        step has only that much left: Engine.prefill_chunk; ending at the next stop), the token just sampled,
        or (to settle) the reply's last one; [] once the prompt is in with nothing to feed (`fed` samples the
        first token from the state's logits). Only a token the reply keeps is ever fed."""
        if self._left:
            n = self.engine.prefill_chunk(self.live, len(self._left), room)
            held = self.prompt_tokens - len(self._left)  # what the state holds now
            while self._stops and self._stops[0] <= held:  # passed by shared cells
                self._stops.pop(0)
            if self._stops:
                n = min(n, self._stops[0] - held)
            self._chunk = self._left[:n]
            return self._chunk
        if self._next is not None:
            return self._next
        if self._reply is None:
            return []
        raise EngramError("this turn has nothing left to feed.")

    def fed(self) -> Iterator[Event]:
        """The step fed `work()` (the Live's last logits are the step's): what happened, as events. A generator:
        the turn moves on as it is read (so a piece is handed on before the prompt state is copied), and must be
        read to its end."""
        if self._left or self._chunk:
            self._left, self._chunk = self._left[len(self._chunk) :], []
            held = self.prompt_tokens - len(self._left)
            if self._stops and self._stops[0] == held:
                self._stops.pop(0)
                yield PrefixState(held, tuple(self.live.token_ids), self.engine.capture(self.live))
            if not self._left:
                yield from self._prompt_in()
        elif self._reply is None:
            yield from self._prompt_in()
        elif self._finish is not None:
            yield self._settled()
        else:
            yield from self._sample()

    def abort(self) -> None:
        """The turn failed half-way (a cancelled prefill leaves it half-fed): nothing can continue from its Live."""
        self.engine.release(self.live)

    def events(self, cancel: threading.Event | None = None) -> Iterator[Event]:
        """The turn alone, as its events: prefill, capture the prompt state, generate, settle, capture the reply
        state; the last event is the TurnDone. `cancel` stops the prefill between chunks (errors.Cancelled)
        and the generation between tokens (finish reason "cancelled", the partial reply kept)."""
        try:
            self.begin(cancel)
            while self.done is None:
                work = self.work()
                if self.prefilling and self.cancel.is_set():  # between chunks: the state holds whole chunks
                    raise Cancelled("the request was cancelled during the prompt prefill.")
                if work:
                    self.engine.step([(self.live, work)])
                yield from self.fed()
        except BaseException:  # a failure, or the reader left before the end: the half-fed Live goes
            if self.done is None:
                self.abort()
            raise

    def run(self, cancel: threading.Event | None = None) -> TurnDone:
        """The turn alone (`events`, read to the end): its TurnDone."""
        for _ in self.events(cancel):
            pass
        return self.done

    def _prompt_in(self) -> Iterator[Event]:
        prefill_ms = (time.perf_counter() - self._t0) * 1000
        self.live.text = self.text
        computed = len(self.feed) - self.shared_tokens
        loaded = self.engine.take_load(self.live)
        self.prompt = Prompt(self.prompt_tokens, computed, self.reset, self.max_tokens, prefill_ms, None, loaded)
        yield Started(self.prompt)
        self._reply = Reply(self.engine.tokenizer, self.live, self.params)
        yield from self._sample(first=True)

    def _sample(self, first: bool = False) -> Iterator[Event]:
        pieces, token = self._reply.next(self.live.last_logits, self.cancel.is_set())
        yield from pieces
        if first:
            # The prompt state, copied once the first token's text is on its way: sampling only read the
            # logits and nothing is fed before the next step, so the state is still the prompt's, and the copy
            # and its snapshot commit do not delay the first token.
            if self.capture and self.feed:
                self.prompt = dataclasses.replace(self.prompt, state=self.engine.capture(self.live))
            yield PromptState(self.prompt)
        if token is not None:
            self._next = [token]
            return
        self._next = None
        self._last_token_at = time.perf_counter()
        self._finish = _closed(self.engine, self._reply.finish)
        yield Finished(self._finish)
        # The last token is on its way to the client; from here on nothing delays it. Settling feeds it.
        if self._finish.pending is not None:
            self._next = [self._finish.pending]
        else:
            yield self._settled()

    def _settled(self) -> TurnDone:
        engine, live, finish = self.engine, self.live, self._finish
        # The state keeps the generated tokens as generated. Its text is what the transcript will render
        # for them (the reply as shown, plus the end-of-turn token if it stopped on one), so the next turn's
        # render extends it and only the new messages get tokenized; the reply's tokens are never
        # re-tokenized, even when their text would not round-trip (partial UTF-8, a stop string cut from
        # the reply).
        live.text = self.text + finish.text + _eos_text(engine, finish)
        self._next = None
        settled_at = time.perf_counter()
        reply_state = engine.capture(live) if self.capture else None
        captured_at = time.perf_counter()
        self.done = TurnDone(
            prompt=self.prompt,
            finish=finish,
            live=live,
            reply_state=reply_state,
            first_token_at=self._reply.first_at,
            last_token_at=self._last_token_at,
            settle_ms=(settled_at - self._last_token_at) * 1000,
            capture_ms=(captured_at - settled_at) * 1000,
        )
        return self.done


def _closed(engine: Engine, finish: Finish) -> Finish:
    """A reply that stopped on an EOS id the template does not write after a reply (a model's
    <|endoftext|> where ChatML closes a turn with <|im_end|>) is closed in the state with the template's
    own end-of-turn id, which is what the next turn's render shows there: the conversation then goes
    on from the state instead of re-prefilling, and the state holds what a stateless server re-rendering
    the transcript would feed. The reply's generated ids (usage, the client's view) stay as sampled."""
    end = engine.turn_end_id
    if finish.reason == "stop" and end is not None and finish.pending in engine.tokenizer.eos_ids:
        return dataclasses.replace(finish, pending=end)
    return finish


def _eos_text(engine: Engine, finish: Finish) -> str:
    tok = engine.tokenizer
    if finish.reason == "stop" and finish.pending is not None and finish.pending in tok.eos_ids:
        return tok.decode([finish.pending], skip_special=False)
    return ""
