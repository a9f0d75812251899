"""The generation loop: sample, stream text, stop, and leave the state consistent.

The last sampled token is not yet in the state when the loop stops (a state cannot be rewound, so we
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


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" (EOS or stop string) | "length" | "cancelled"
    token_ids: tuple[int, ...]  # every generated token, EOS included
    text: str  # the reply as shown: no EOS, no stop string
    pending: int | None  # last sampled token the state has not consumed yet
    ttft_s: float | None  # generate() call to first sampled token
    decode_s: float  # time spent after the first token
    # with params.logprobs: one entry per reply token (an end-of-turn id that ended it has none), in order
    logprobs: tuple[TokenLogprob, ...] = ()


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


class Generation:
    """Iterate for text pieces; afterwards `.finish` tells how it ended."""

    def __init__(
        self,
        backend: Backend,
        tokenizer: ChatTokenizer,
        live: Live,
        params: SamplingParams,
        cancel: threading.Event | None = None,
    ):
        if live.last_logits is None:
            raise EngramError("nothing to generate from: the state has consumed no tokens.")
        if params.max_tokens is None:
            raise EngramError("a generation needs max_tokens (a turn sets it from the context's room).")
        self._backend, self._tok, self._live, self._params = backend, tokenizer, live, params
        self._cancel = cancel or threading.Event()
        self.finish: Finish | None = None

    def __iter__(self) -> Iterator[Piece]:
        start = time.perf_counter()
        first_at = None
        sampler = Sampler(self._params, self._tok, self._live.token_ids)
        detok = IncrementalDetokenizer(lambda ids: self._tok.decode(ids, skip_special=True))
        stops = StopMatcher(self._params.stop)
        logits = self._live.last_logits
        generated: list[int] = []
        shown: list[str] = []
        reason, pending = "length", None
        carried = 0  # sampler.logprobs[:carried] went out with a piece
        for i in range(self._params.max_tokens):
            if self._cancel.is_set():
                reason = "cancelled"
                break
            token = sampler.pick(logits)
            sampler.accept(token)
            first_at = first_at or time.perf_counter()
            generated.append(token)
            if token in self._tok.eos_ids:
                reason, pending = "stop", token
                break
            piece, hit = stops.push(detok.push(token))
            if piece:
                shown.append(piece)
                yield Piece(piece, tuple(sampler.logprobs[carried:]))
                carried = len(sampler.logprobs)
            if hit:
                reason, pending = "stop", token
                break
            if i == self._params.max_tokens - 1:
                pending = token
                break
            logits = self._backend.decode(self._live, token)
        ended_on_eos = reason == "stop" and pending in self._tok.eos_ids
        entries = tuple(sampler.logprobs[: len(sampler.logprobs) - ended_on_eos])  # the reply's tokens
        tail = stops.flush()  # empty after a stop-string hit; otherwise text held back in vain
        if tail:
            shown.append(tail)
            yield Piece(tail, entries[carried:])
        end = time.perf_counter()
        self.finish = Finish(
            reason=reason,
            token_ids=tuple(generated),
            text="".join(shown),
            pending=pending,
            ttft_s=None if first_at is None else first_at - start,
            decode_s=0.0 if first_at is None else end - first_at,
            logprobs=entries,
        )


def settle(backend: Backend, live: Live, finish: Finish) -> None:
    """Feed the pending token, so the state holds every token of the reply. The state's text is the
    turn's to set (engine/turn.py): it depends on what the transcript will show."""
    if finish.pending is not None:
        backend.decode(live, finish.pending)
