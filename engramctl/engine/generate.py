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

import torch

from engramctl.engine.backend import Backend, Live
from engramctl.engine.sampling import Sampler, SamplingParams
from engramctl.engine.textstream import IncrementalDetokenizer, StopMatcher
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import EngramError


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" (EOS or stop string) | "length" | "cancelled"
    token_ids: tuple[int, ...]  # every generated token, EOS included
    text: str  # the reply as shown: no EOS, no stop string
    pending: int | None  # last sampled token the state has not consumed yet
    ttft_s: float | None  # the reply's start to its first sampled token
    decode_s: float  # time spent after the first token


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
        self._start = time.perf_counter()
        self.first_at: float | None = None
        self.finish: Finish | None = None

    def next(self, logits: torch.Tensor, cancelled: bool = False) -> tuple[list[str], int | None]:
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
        pieces = [piece] if piece else []
        self._shown.extend(pieces)
        if hit:
            return self._end("stop", token, pieces)
        if len(self._generated) == self._params.max_tokens:
            return self._end("length", token, pieces)
        return pieces, token

    def _end(self, reason: str, pending: int | None, pieces: list[str] | None = None) -> tuple[list[str], None]:
        pieces = list(pieces or [])
        tail = self._stops.flush()  # empty after a stop-string hit; otherwise text held back in vain
        if tail:
            pieces.append(tail)
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

    def __iter__(self) -> Iterator[str]:
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
