"""From worker-job events to HTTP answers: OpenAI chat completion JSON, SSE chunks, and client
disconnects turned into cancellation.

A turn job's events (daemon/job.py `Job.events`) are `start` (a TurnResult: the turn's prompt is in the
state), `piece` (text: an engine Piece, which carries the logprob entries of the tokens it covers) ...,
`finish` (the TurnResult once generation stopped), then `done` (the recorded TurnResult, or a route's own
JSON) or `error`. A stream is

    {"choices": [{"delta": {"role": "assistant", ...}}], "engram": {origin}}    at `start`
    {"choices": [{"delta": {"content": ...}}]} ...                               each `piece`
    {"choices": [{"delta": {}, "finish_reason": ...}]}                          at `finish`, at once
    {"choices": [], "engram": {...snapshot_id}, "usage": {...}?}                 at `done`, once recorded (*)
    [DONE]

(*) only for a request that names a session or asks for usage (answer_turn's `trailer`).

A client sees the reply end as soon as generation stops, while the reply state is settled, captured
and committed; the `engram` object (turn_json.py) with the snapshot id follows in the trailing chunk.
A streamed answer starts only once `start` has arrived, so everything that can be refused (unknown
session, prompt too long, queue full) still gets its own HTTP status instead of a 200 that fails half-way.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, AsyncIterator, Awaitable, Sequence

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.daemon.errors import Cancelled, body_for
from engramctl.daemon.job import Job
from engramctl.daemon.json_frame import Frame, encode, slot
from engramctl.daemon.logprobs_json import LogprobText
from engramctl.daemon.turn_json import engram_json, finish_reason, usage_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.engine.logprobs import TokenLogprob

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Cancelled):
    pass


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read already, so receive() waits for it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _until_gone(job: Job, request: Request, wanted: Awaitable[Any]) -> Any:
    """`wanted` (reading the job's events), unless the client goes away first: then the job is cancelled and
    ClientGone raised."""
    want = asyncio.ensure_future(wanted)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({want, gone}, return_when=asyncio.FIRST_COMPLETED)
        if want in done:
            return want.result()
        job.cancel.set()
        raise ClientGone("the client disconnected.")
    finally:
        want.cancel()
        gone.cancel()


async def job_result(job: Job, request: Request) -> Any:
    """Wait for a job to finish, watching for the client to go away; its error is raised here."""
    return await _until_gone(job, request, job.result())


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
        self._text_frame: Frame | None = None  # a text chunk's JSON, made once

    def logprobs_json(self, entries: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
        """A choice's `logprobs`: null when not asked for, or for a chunk that covers no token (None)."""
        return None if self.logprobs is None or entries is None else self.logprobs.chat(entries)

    def response(self, r: TurnResult) -> dict[str, Any]:
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
                    "logprobs": self.logprobs_json(r.logprobs),
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

    def text_sse(self, text: str, entries: Sequence[TokenLogprob] = ()) -> str:
        """sse(self.chunk({"content": text}, entries=entries)). A stream sends one such event a token, and only
        the text changes while no logprobs are asked for: the rest of its JSON is made once (json_frame.py)."""
        if self.logprobs is not None:
            return sse(self.chunk({"content": text}, entries=entries))
        if self._text_frame is None:
            self._text_frame = Frame(self.chunk({"content": slot(0)}))
        return f"data: {self._text_frame.fill(text)}\n\n"

    def usage_chunk(self, usage: dict | None = None, **extra: Any) -> dict[str, Any]:
        """A chunk with no choices: the usage (when asked for) and/or the `engram` object of a recorded turn."""
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [],
            **({} if usage is None else {"usage": usage}),
            **extra,
        }


def sse(obj: Any) -> str:
    return f"data: {encode(obj)}\n\n"


async def first_event(job: Job, request: Request) -> tuple[str, Any]:
    """A streamed answer's first event, "start" (the turn has begun) or "done", watching for the client to
    go away; an error is raised here, so a refusal still gets its own HTTP status."""
    kind, value = await _until_gone(job, request, anext(job.events()))
    if kind == "error":
        raise value
    return kind, value


async def answer_turn(
    job: Job, request: Request, completion: Completion, stream: bool, include_usage: bool, trailer: bool = True
):
    """The HTTP answer to a generating job: a JSON completion, or an SSE stream once it has started. A stream
    ends with the chunk without choices (the usage, the `engram` object with the snapshot id) only when the
    request asks for usage or for `trailer`: the common client loop `chunk.choices[0].delta` of a stock
    client, which OpenAI sends such a chunk only with include_usage, fails on it."""
    if not stream:
        result = await job_result(job, request)
        if isinstance(result, TurnResult):
            return JSONResponse(completion.response(result))
        return JSONResponse(result)
    kind, value = await first_event(job, request)
    if kind == "done":  # a job that generated nothing (restore without a continuation)
        return JSONResponse(value if not isinstance(value, TurnResult) else completion.response(value))
    return StreamingResponse(
        _events(job, completion, value, include_usage, trailer or include_usage),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def _events(
    job: Job, completion: Completion, start: TurnResult, include_usage: bool, trailer: bool
) -> AsyncIterator[str]:
    try:
        yield sse(completion.chunk({"role": "assistant", "content": ""}, engram=engram_json(start)))
        sent = 0  # logprob entries the chunks carried so far
        finished = False
        async for kind, value in job.events():
            if kind == "piece":
                entries = getattr(value, "logprobs", ())
                sent += len(entries)
                yield completion.text_sse(str(value), entries)
            elif kind in ("finish", "done") and not finished:
                finished = True
                r: TurnResult = value
                rest = r.logprobs[sent:] or None  # tokens whose text no piece showed (a stop string's)
                yield sse(completion.chunk({}, finish_reason(r), entries=rest))
            if kind == "done":
                usage = usage_json(value) if include_usage else None
                if trailer:
                    yield sse(completion.usage_chunk(usage, engram=engram_json(value)))
                yield "data: [DONE]\n\n"
            elif kind == "error":
                _, body = body_for(value)
                yield sse(body)
                yield "data: [DONE]\n\n"
    finally:
        job.cancel.set()  # the client went away mid-stream (or we are done: then it changes nothing)
