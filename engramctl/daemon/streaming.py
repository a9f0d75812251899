"""From worker-job events to HTTP answers: OpenAI chat completion JSON, SSE chunks, and client
disconnects turned into cancellation.

A job emits `start` (a TurnStart: the turn's prompt is in the state), `piece` (text: an engine Piece,
which carries the logprob entries of the tokens it covers) ..., then `done` (a ChatResult, or a route's own
JSON) or `error`. The `engram` extension object and `usage` are built
here from those domain objects. A streamed answer starts only once `start` has arrived, so
everything that can be refused (unknown session, prompt too long, queue full) still gets its own
HTTP status instead of a 200 that fails half-way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from typing import Any, AsyncIterator, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.daemon.errors import Cancelled, body_for
from engramctl.daemon.logprobs_json import LogprobText
from engramctl.daemon.service import ChatResult, TurnStart
from engramctl.daemon.worker import Job
from engramctl.engine.logprobs import TokenLogprob
from engramctl.protocol import TurnInfo

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Cancelled):
    pass


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read already, so receive() waits for it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class Watch:
    """Reads a job's events while watching for the client to disconnect; a disconnect cancels the job."""

    def __init__(self, job: Job, request: Request):
        self.job = job
        self._gone = asyncio.ensure_future(_disconnected(request))

    async def next(self) -> tuple[str, Any]:
        get = asyncio.ensure_future(self.job.events.get())
        done, _ = await asyncio.wait({get, self._gone}, return_when=asyncio.FIRST_COMPLETED)
        if get in done:
            return get.result()
        get.cancel()
        self.job.cancel.set()
        raise ClientGone("the client disconnected.")

    def stop(self) -> None:
        self._gone.cancel()


async def job_result(job: Job, request: Request) -> Any:
    """Wait for a job to finish; its error is raised here."""
    watch = Watch(job, request)
    try:
        while True:
            kind, value = await watch.next()
            if kind == "done":
                return value
            if kind == "error":
                raise value
    finally:
        watch.stop()


def turn_info(s: TurnStart, r: ChatResult | None = None) -> TurnInfo:
    """A turn's `engram` extension: its origin, and with `r` its outcome (finish_reason is the engine's:
    it says "cancelled")."""
    o, p = s.origin, s.prompt
    info = TurnInfo(
        session=s.session,
        resumed=o.restored_tokens > 0,
        restored_tokens=o.restored_tokens,
        tier=o.tier,
        restore_ms=o.restore_ms,
        prompt_tokens=p.prompt_tokens,
        cached_tokens=p.cached_tokens,
        computed_tokens=p.computed_tokens,
        prefill_ms=round(p.prefill_ms, 2),
    )
    if r is None:
        return info
    return dataclasses.replace(
        info,
        snapshot_id=r.snapshot_id,
        snapshot_error=r.recorded.error,
        finish_reason=r.finish.reason,
        completion_tokens=len(r.finish.token_ids),
        ttft_ms=None if r.ttft_ms is None else round(r.ttft_ms, 2),
        decode_ms=round(r.done.decode_ms, 2),
    )


def engram_start(s: TurnStart) -> dict[str, Any]:
    """The `engram` object of a stream's first chunk: the origin (the outcome's fields are null)."""
    return turn_info(s).to_json()


def engram_json(r: ChatResult) -> dict[str, Any]:
    """The `engram` object of a finished turn."""
    return turn_info(r.start, r).to_json()


def usage_json(r: ChatResult) -> dict[str, Any]:
    p, n = r.start.prompt, len(r.finish.token_ids)
    return {
        "prompt_tokens": p.prompt_tokens,
        "completion_tokens": n,
        "total_tokens": p.prompt_tokens + n,
        "prompt_tokens_details": {"cached_tokens": p.cached_tokens},
    }


def finish_reason(r: ChatResult) -> str:
    """OpenAI's: "stop" | "length" (a cancelled reply was cut short, as by a length limit)."""
    return "length" if r.finish.reason == "cancelled" else r.finish.reason


class Completion:
    """Builds the OpenAI-shaped objects of one completion. `model` is the served model's name,
    whatever name the request gave. With `logprobs` (the request asked for them), choices carry the tokens'
    logprobs; without, `logprobs` is null."""

    def __init__(self, model: str, fingerprint: str, logprobs: LogprobText | None = None):
        self.id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.fingerprint = f"fp_{fingerprint[:12]}"
        self.logprobs = logprobs

    def logprobs_json(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        """A choice's `logprobs`: null when not asked for, or for a chunk that covers no token (None)."""
        return None if self.logprobs is None or entries is None else self.logprobs.chat(entries)

    def response(self, r: ChatResult) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": r.text},
                    "logprobs": self.logprobs_json(r.finish.logprobs),
                    "finish_reason": finish_reason(r),
                }
            ],
            "usage": usage_json(r),
            "engram": engram_json(r),
        }

    def chunk(
        self,
        delta: dict,
        finish_reason: str | None = None,
        entries: Sequence[TokenLogprob] | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """`entries`: the logprobs of the tokens this chunk's text covers."""
        logprobs = self.logprobs_json(entries)
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}],
            **extra,
        }

    def usage_chunk(self, usage: dict) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [],
            "usage": usage,
        }


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def first_event(job: Job, request: Request) -> tuple[str, Any]:
    """A streamed answer's first event, "start" (the turn has begun) or "done", watching for the client to
    go away; an error is raised here, so a refusal still gets its own HTTP status."""
    watch = Watch(job, request)
    try:
        kind, value = await watch.next()
    finally:
        watch.stop()
    if kind == "error":
        raise value
    return kind, value


async def answer_turn(job: Job, request: Request, completion: Completion, stream: bool, include_usage: bool):
    """The HTTP answer to a generating job: a JSON completion, or an SSE stream once it has started."""
    if not stream:
        result = await job_result(job, request)
        if isinstance(result, ChatResult):
            return JSONResponse(completion.response(result))
        return JSONResponse(result)
    kind, value = await first_event(job, request)
    if kind == "done":  # a job that generated nothing (restore without a continuation)
        return JSONResponse(value if not isinstance(value, ChatResult) else completion.response(value))
    return StreamingResponse(
        _events(job, completion, value, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _events(job: Job, completion: Completion, start: TurnStart, include_usage: bool) -> AsyncIterator[str]:
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}, engram=engram_start(start)))
        sent = 0  # logprob entries the chunks carried so far
        while True:
            kind, value = await job.events.get()
            if kind == "piece":
                entries = getattr(value, "logprobs", ())
                sent += len(entries)
                yield sse(completion.chunk({"content": str(value)}, entries=entries))
            elif kind == "done":
                r: ChatResult = value
                rest = r.finish.logprobs[sent:] or None  # tokens whose text no piece showed (a stop string's)
                yield sse(completion.chunk({}, finish_reason(r), entries=rest, engram=engram_json(r)))
                if include_usage:
                    yield sse(completion.usage_chunk(usage_json(r)))
                yield "data: [DONE]\n\n"
                return
            elif kind == "error":
                _, body = body_for(value)
                yield sse(body)
                yield "data: [DONE]\n\n"
                return
    finally:
        job.cancel.set()  # the client went away mid-stream (or we are done: then it changes nothing)
