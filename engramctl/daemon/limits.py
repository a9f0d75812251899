"""Request body size cap: a declared Content-Length over the cap is refused before reading; a chunked
body is counted as it arrives and refused as soon as it passes the cap. JSON routes get MAX_BODY_BYTES;
the few routes that take a file (LARGE_BODY_PATHS) get their own, larger cap."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException

from engramctl.daemon.engram_api import answers
from engramctl.daemon.errors import INVALID_REQUEST, error_body

MAX_BODY_BYTES = 8 * 2**20
MAX_IMPORT_BYTES = 4 * 2**30  # a snapshot file: a constant state plus the attention KV of its tokens
LARGE_BODY_PATHS = {"/import_snapshot": MAX_IMPORT_BYTES}


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int = MAX_BODY_BYTES, large: dict[str, int] | None = None):
        self.app, self.max_bytes = app, max_bytes
        self.large = LARGE_BODY_PATHS if large is None else large

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.large.get(scope.get("path", ""), self.max_bytes)
        for key, value in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await self._refuse(scope, send, "the Content-Length header is not a number.", 400)
                if declared > limit:
                    return await self._refuse(scope, send, self._message(declared, limit))
                # The HTTP parser reads exactly the declared length: nothing to count, and the response's
                # messages (a token each, streamed) go straight through
                return await self.app(scope, receive, send)
        seen = 0
        started = False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge(self._message(seen, limit))
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(scope, send, self._message(seen, limit))

    @staticmethod
    def _message(n: int, limit: int) -> str:
        return f"the request body ({n} bytes) is larger than the {limit // 2**20} MiB limit."

    async def _refuse(self, scope, send, message: str, status: int = 413) -> None:
        code = "request_too_large" if status == 413 else INVALID_REQUEST
        body = json.dumps(answers.failure(scope.get("path", ""), error_body(message, status, code))).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader passes it through (it turns other errors into 400)."""

    def __init__(self, message: str = "the request body is too large."):
        super().__init__(status_code=413, detail=message)


class JsonContentTypeMiddleware:
    """Every body this API takes is JSON: treat form/text/missing content types as JSON (curl -d sends
    application/x-www-form-urlencoded), as llama.cpp's and Ollama's servers do."""

    _AS_JSON = (b"", b"application/x-www-form-urlencoded", b"text/plain")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") in ("POST", "PUT", "PATCH"):
            headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
            current = next((v for k, v in scope.get("headers", ()) if k == b"content-type"), b"")
            if current.split(b";")[0].strip().lower() in self._AS_JSON:
                scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        await self.app(scope, receive, send)


RETRY_AFTER_S = 1  # a turn of a small model takes well under a second; a client retrying sooner is refused again


class RetryAfterMiddleware:
    """Every 429 (the worker's queue is full) tells the client when to try again, as RFC 9110 asks:
    `Retry-After: 1`. Added here, on the way out, so no route or handler can forget it."""

    def __init__(self, app, seconds: int = RETRY_AFTER_S):
        self.app, self.value = app, str(int(seconds)).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_retry_after(message):
            if message["type"] == "http.response.start" and message["status"] == 429:
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() != b"retry-after"]
                message = {**message, "headers": headers + [(b"retry-after", self.value)]}
            await send(message)

        await self.app(scope, receive, with_retry_after)
