"""Generating a reply, one token at a time: sample, stream text, stop, and leave the state consistent.

`Reply` is one reply's loop body as a state machine: the caller (a turn, stepped by the daemon's scheduler
or run alone) feeds the token it is told to and hands back the logits; `Reply.next` samples the next
token, says what text to show, and either asks for that token to be fed or ends the reply.

The last sampled token is not yet in the state when the reply ends (a state cannot be rewound, so we
never feed a token we might not keep). `settle()` feeds it after the reply has been streamed, so the
snapshot holds every token of the reply and the logits to continue from. engine/turn.py runs both.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator

from engramctl.engine.backend import Backend, Live
from engramctl.engine.sampling import Sampler, SamplingParams, TokenLogprob
from engramctl.engine.textstream import IncrementalDetokenizer, StopMatcher
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import EngramError
from engramctl.store.arrays import Array


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" (EOS or stop string) | "length" | "cancelled"
    token_ids: tuple[int, ...]  # every generated token, EOS included
    text: str  # the reply as shown: no EOS, no stop string
    pending: int | None  # last sampled token the state has not consumed yet
    ttft_s: float | None  # the reply's start to its first sampled token
    decode_s: float  # time spent after the first token
    # with params.logprobs: one entry per reply token (an end-of-turn id that ended it has none), in order
    logprobs: tuple[TokenLogprob, ...] = ()
    first_token_at: float | None = None  # time.perf_counter() marks: the first token was sampled,
    ended_at: float | None = None  # ... and the reply ended (for callers timing it from their own start)


class Piece(str):
    """A piece of reply text, as the generation yields it: a str, which also carries the logprob entries of
    the tokens sampled since the previous piece (with params.logprobs; else none). The tokens whose text was
    held back (half a character, a possible stop string) go with the piece that shows it; entries no piece
    carried are in Finish.logprobs past those the pieces did."""

    logprobs: tuple[TokenLogprob, ...]

    def __new__(cls, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> "Piece":
        piece = super().__new__(cls, text)
        piece.logprobs = logprobs
        return piece


class Reply:
    """One reply from `live`'s last logits. Call `next(logits)` with the state's logits: it returns the text
    to show and the token to feed before the next call, or None once the reply has ended (`.finish` then)."""

    def __init__(self, tokenizer: ChatTokenizer, live: Live, params: SamplingParams):
        if live.last_logits is None:
            raise EngramError("nothing to generate from: the state has consumed no tokens.")
        if params.max_tokens is None:
            raise EngramError("a generation needs max_tokens (a turn sets it from the context's room).")
        self._tok, self._params = tokenizer, params
        self.sampler = Sampler(params, tokenizer, live.token_ids)
        self._detok = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special=True))
        self._stops = StopMatcher(params.stop)
        self._generated: list[int] = []
        self._shown: list[str] = []
        self._carried = 0  # sampler.logprobs[:_carried] went out with a piece
        self._start = time.perf_counter()
        self.first_at: float | None = None
        self.finish: Finish | None = None

    def next(self, logits: Array, cancelled: bool = False) -> tuple[list[Piece], int | None]:
        """(text pieces to show, the token to feed next), or (pieces, None) when the reply ends here."""
        if len(self._generated) >= self._params.max_tokens:
            return self._end("length", None)
        if cancelled:
            return self._end("cancelled", None)
        token = self.sampler.pick(logits)
        self.sampler.accept(token)
        self.first_at = self.first_at or time.perf_counter()
        self._generated.append(token)
        if token in self._tok.eos_ids:
            return self._end("stop", token)
        piece, hit = self._stops.push(self._detok.push(token))
        pieces = [self._piece(piece, self.sampler.logprobs)] if piece else []
        self._shown.extend(pieces)
        if hit:
            return self._end("stop", token, pieces)
        if len(self._generated) == self._params.max_tokens:
            return self._end("length", token, pieces)
        return pieces, token

    def _piece(self, text: str, entries: list | tuple) -> Piece:
        """`text` with the logprob entries of the tokens since the last piece."""
        piece = Piece(text, tuple(entries[self._carried :]))
        self._carried = len(entries)
        return piece

    def _end(self, reason: str, pending: int | None, pieces: list[Piece] | None = None) -> tuple[list[Piece], None]:
        pieces = list(pieces or [])
        ended_on_eos = reason == "stop" and pending in self._tok.eos_ids
        entries = tuple(self.sampler.logprobs[: len(self.sampler.logprobs) - ended_on_eos])  # the reply's tokens
        tail = self._stops.flush()  # empty after a stop-string hit; otherwise text held back in vain
        if tail:
            pieces.append(self._piece(tail, entries))
            self._shown.append(tail)
        end = time.perf_counter()
        first = self.first_at
        self.finish = Finish(
            reason=reason,
            token_ids=tuple(self._generated),
            text="".join(self._shown),
            pending=pending,
            ttft_s=None if first is None else first - self._start,
            decode_s=0.0 if first is None else end - first,
            logprobs=entries,
            first_token_at=first,
            ended_at=end,
        )
        return pieces, None


class Generation:
    """A reply generated alone, as an iterator of text pieces; afterwards `.finish` tells how it ended."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: ChatTokenizer,
        live: Live,
        params: SamplingParams,
        cancel: threading.Event | None = None,
    ):
        self._backend, self._live = backend, live
        self._reply = Reply(tokenizer, live, params)
        self._cancel = cancel or threading.Event()
        self.finish: Finish | None = None

    def __iter__(self) -> Iterator[Piece]:
        logits = self._live.last_logits
        while True:
            pieces, token = self._reply.next(logits, self._cancel.is_set())
            yield from pieces
            if token is None:
                self.finish = self._reply.finish
                return
            logits = self._backend.decode(self._live, token)


def settle(backend: Backend, live: Live, finish: Finish) -> None:
    """Feed the pending token, so the state holds every token of the reply. The state's text is the
    turn's to set (engine/turn.py): it depends on what the transcript will show."""
    if finish.pending is not None:
        backend.decode(live, finish.pending)
