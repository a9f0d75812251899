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
    ttft_s: float | None  # generate() call to first sampled token
    decode_s: float  # time spent after the first token


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

    def __iter__(self) -> Iterator[str]:
        start = time.perf_counter()
        first_at = None
        sampler = Sampler(self._params, self._tok, self._live.token_ids)
        detok = IncrementalDetokenizer(lambda ids: self._tok.decode(ids, skip_special=True))
        stops = StopMatcher(self._params.stop)
        logits = self._live.last_logits
        generated: list[int] = []
        shown: list[str] = []
        reason, pending = "length", None
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
                yield piece
            if hit:
                reason, pending = "stop", token
                break
            if i == self._params.max_tokens - 1:
                pending = token
                break
            logits = self._backend.decode(self._live, token)
        tail = stops.flush()  # empty after a stop-string hit; otherwise text held back in vain
        if tail:
            shown.append(tail)
            yield tail
        end = time.perf_counter()
        self.finish = Finish(
            reason=reason,
            token_ids=tuple(generated),
            text="".join(shown),
            pending=pending,
            ttft_s=None if first_at is None else first_at - start,
            decode_s=0.0 if first_at is None else end - first_at,
        )


def settle(backend: Backend, live: Live, finish: Finish) -> None:
    """Feed the pending token, so the state holds every token of the reply. The state's text is the
    turn's to set (engine/turn.py): it depends on what the transcript will show."""
    if finish.pending is not None:
        backend.decode(live, finish.pending)
