"""One chat turn, the only place it is written: the daemon's service and the benchmark both run it.

    turn = Turn.for_messages(engine, live, messages, params)   # plans; refuses touching nothing
    done = turn.run(cancel, on_start=..., on_prompt=..., on_piece=..., on_finish=...)
    # prefill -> first token -> capture the prompt state -> generate (on_finish when it stops) -> settle -> capture

`run` is the turn alone. The daemon's scheduler (daemon/scheduler.py) steps many at once through the same
state machine: `begin`, then per step `work()` (a prompt chunk, the token just sampled, or the last one to
settle) fed by `Engine.step`, then `fed()`, until `done`; so a turn computes the same tokens either way.

A turn starts from a live state the caller chose (hot, restored from a snapshot, or new) and either
the whole conversation (the chat template's render past what the state consumed is fed) or the
prompt's token ids (a stock OpenAI client's request, when the state holds a prefix of them). It ends
with the prompt state, the reply and the reply state. Where the state came from and what gets
recorded afterwards (snapshots, transcript) is the caller's.

Ownership: `begin()` (and `run()`) owns the Live it is given. It releases it when the chat template forces a fresh
state, and when the turn fails half-way (a cancelled prefill leaves it half-fed); the Live it returns
is the caller's. Planning (the constructors) changes nothing, so a refused turn leaves the state usable.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Callable

from engramctl.engine.backend import Live
from engramctl.engine.chat import plan_turn
from engramctl.engine.engine import Engine
from engramctl.engine.generate import Finish, Reply
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
    """A planned turn: what to feed, and the reply's budget. Build it with for_messages / for_tokens."""

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
    ):
        self.engine, self.live, self.feed, self.text, self.reset = engine, live, feed, text, reset
        self.prompt_tokens = (0 if reset else len(live.token_ids)) + len(feed)
        self.max_tokens = reply_budget(engine, self.prompt_tokens, params.max_tokens, default_max_tokens)
        self.params = dataclasses.replace(params, max_tokens=self.max_tokens)
        self.capture = capture

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
    ) -> "Turn":
        """The whole conversation (plain role/content dicts, ending with the new message): only the
        template's render past the state's consumed text is fed, or all of it when the template is not
        prefix-stable there."""
        text, reset = plan_turn(engine.tokenizer, live.text, messages, engine.prefix_stable)
        engine.check_text(text)
        full = text if reset else live.text + text
        return cls(engine, live, engine.tokenizer.encode(text), full, reset, params, default_max_tokens, capture)

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
    ) -> "Turn":
        """The prompt's token ids and the text they encode; `live` holds a prefix of them."""
        n = len(live.token_ids)
        if live.token_ids != ids[:n]:
            raise EngramError("the state's tokens are not a prefix of the prompt's; it cannot continue to it.")
        return cls(engine, live, ids[n:], text, False, params, default_max_tokens, capture)

    # -- stepping: the daemon's scheduler runs many turns one step at a time, `run` runs one alone ---------
    def begin(
        self,
        cancel: threading.Event | None = None,
        *,
        on_start: Callable[[Prompt], None] | None = None,
        on_prompt: Callable[[Prompt], None] | None = None,
        on_piece: Callable[[str], None] | None = None,
        on_finish: Callable[[Finish], None] | None = None,
    ) -> None:
        """Start the turn: from here on it owns its Live (`abort` releases it). A turn with nothing to feed
        samples its first token at once. `on_start` hears the prompt is in the state (Prompt.state None yet),
        `on_prompt` its captured state once the first token's text went to `on_piece`; `on_finish` hears how
        the reply ended as soon as generation stops, before the reply state is settled and captured."""
        self._cancel = cancel or threading.Event()
        self._on_start, self._on_prompt, self._on_piece, self._on_finish = on_start, on_prompt, on_piece, on_finish
        self._prompt_uncaptured = False
        self._left, self._chunk, self._next = list(self.feed), [], None
        self.shared_tokens = 0  # the prompt's first tokens taken from another conversation's cells (share_prefix)
        self._reply: Reply | None = None
        self._finish: Finish | None = None
        self.done: TurnDone | None = None
        if self.reset:
            self.engine.release(self.live)
            self.live = self.engine.new_live()
        self._t0 = time.perf_counter()
        if not self._left:
            self._prompt_in()

    @property
    def prefilling(self) -> bool:
        return bool(self._left)

    def share_prefix(self) -> None:
        """Before the first chunk of a prompt fed to an empty state: start from the cells of another
        conversation that begins the same way (Engine.share_prefix), so only the rest is computed. The
        scheduler asks only when other turns run (a turn alone computes its whole prompt, as it always did);
        the last token is always computed, for the logits."""
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
        step has only that much left: Engine.prefill_chunk), the token just sampled, or (to settle) the
        reply's last one. Only a token the reply keeps is ever fed."""
        if self._left:
            self._chunk = self._left[: self.engine.prefill_chunk(self.live, len(self._left), room)]
            return self._chunk
        if self._next is None:
            raise EngramError("this turn has nothing left to feed.")
        return self._next

    def fed(self) -> None:
        """The step fed `work()`; the Live's last logits are the step's. Samples the next token (text pieces
        go to on_piece), or finishes the turn (`done`)."""
        if self._left:
            self._left = self._left[len(self._chunk) :]
            if not self._left:
                self._prompt_in()
        elif self._finish is not None:
            self._settled()
        else:
            self._sample()

    def abort(self) -> None:
        """The turn failed half-way (a cancelled prefill leaves it half-fed): nothing can continue from its Live."""
        self.engine.release(self.live)

    def run(
        self,
        cancel: threading.Event | None = None,
        *,
        on_start: Callable[[Prompt], None] | None = None,
        on_prompt: Callable[[Prompt], None] | None = None,
        on_piece: Callable[[str], None] | None = None,
        on_finish: Callable[[Finish], None] | None = None,
    ) -> TurnDone:
        """The turn alone: prefill, capture the prompt state, generate (each piece of text to `on_piece` as it
        comes), settle, capture the reply state. `cancel` stops the prefill between chunks (errors.Cancelled)
        and the generation between tokens (finish reason "cancelled", the partial reply kept)."""
        try:
            self.begin(cancel, on_start=on_start, on_prompt=on_prompt, on_piece=on_piece, on_finish=on_finish)
            while self.done is None:
                work = self.work()
                if self.prefilling and self._cancel.is_set():  # between chunks: the state holds whole chunks
                    raise Cancelled("the request was cancelled during the prompt prefill.")
                self.engine.step([(self.live, work)])
                self.fed()
        except BaseException:
            self.abort()
            raise
        return self.done

    def _prompt_in(self) -> None:
        prefill_ms = (time.perf_counter() - self._t0) * 1000
        self.live.text = self.text
        computed = len(self.feed) - self.shared_tokens
        self.prompt = Prompt(self.prompt_tokens, computed, self.reset, self.max_tokens, prefill_ms, None)
        self._prompt_uncaptured = True
        if self._on_start is not None:
            self._on_start(self.prompt)
        self._reply = Reply(self.engine.tokenizer, self.live, self.params)
        self._sample()

    def _capture_prompt(self) -> None:
        """The prompt state, copied once the first token's text is on its way: sampling only read the
        logits and nothing is fed before the next step, so the state is still the prompt's, and the copy
        and its snapshot commit do not delay the first token."""
        self._prompt_uncaptured = False
        if self.capture and self.feed:
            self.prompt = dataclasses.replace(self.prompt, state=self.engine.capture(self.live))
        if self._on_prompt is not None:
            self._on_prompt(self.prompt)

    def _sample(self) -> None:
        pieces, token = self._reply.next(self.live.last_logits, self._cancel.is_set())
        if self._on_piece is not None:
            for piece in pieces:
                self._on_piece(piece)
        if self._prompt_uncaptured:
            self._capture_prompt()
        if token is not None:
            self._next = [token]
            return
        self._last_token_at = time.perf_counter()
        self._finish = _closed(self.engine, self._reply.finish)
        if self._on_finish is not None:
            self._on_finish(self._finish)
        # The last token is on its way to the client; from here on nothing delays it. Settling feeds it.
        if self._finish.pending is not None:
            self._next = [self._finish.pending]
        else:
            self._settled()

    def _settled(self) -> None:
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
        first = self._reply.first_at
        self.done = TurnDone(
            prompt=self.prompt,
            finish=finish,
            live=live,
            reply_state=reply_state,
            first_token_at=first,
            last_token_at=self._last_token_at,
            settle_ms=(settled_at - self._last_token_at) * 1000,
            capture_ms=(captured_at - settled_at) * 1000,
        )


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
