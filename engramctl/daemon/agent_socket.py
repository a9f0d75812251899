"""One agent WebSocket connection (`/v1/agent/ws`, opened by routes_agent.py once the client is
authenticated): its session, the reply in flight, tool calls alongside, and the messages' protocol.

WebSocket protocol (JSON text frames; every client message may carry an "id", echoed in its answers):
    auth    {"type": "auth", "token": "..."}: the first message, when no Authorization header was sent
    ->      {"type": "ready", "session", "model", "tools": [names], "protocol": 1}
    chat    {"type": "chat", "content": "text"} or {"messages": [{"role", "content"}, ...]}, optional
            temperature, top_p, top_k, max_tokens, seed, stop
    ->      {"type": "token", "id", "text"} ..., then {"type": "done", "id", "text", "finish_reason",
            "usage", "engram"}, or {"type": "error", ...}; one reply at a time per connection
    call    {"type": "call", "tool": name, "arguments": {...}}: `session` (branch: `source`) defaults to
            this connection's session
    ->      {"type": "result", "id", "tool", "result": {...}} or {"type": "error", ...}
    cancel  {"type": "cancel"}: stops the reply in flight (it still ends with `done`, finish_reason
            "cancelled", the partial reply recorded; or with an `error` "cancelled" during the prefill)
    ->      {"type": "cancelled", "id", "reply_id": the chat's id, or null when nothing was running}
    ping    -> {"type": "pong", "id"}
    error   {"type": "error", "id", "error": {"message", "code", "param"?, "hint"?}}: a malformed message
            gets one and the connection stays up, its session and any reply in flight untouched.
The session is `?session=NAME` (or `?conversation_id=`, or "session" in the auth message), else a new
`ws-<hex>` one. A wrong token in the header is refused with HTTP 401; a wrong or missing auth message
closes with 1008 (routes_agent.py, before this connection exists).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import WebSocket
from pydantic import ValidationError

from engramctl.agent.tools import STATE_TOOLS, error_json
from engramctl.daemon.dispatch import Dispatcher
from engramctl.daemon.errors import validation_problem
from engramctl.daemon.schemas import ChatMessage, Sampling
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.turn_json import engram_json, usage_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.errors import EngramError, UsageError

log = logging.getLogger("engramctl.daemon")

PROTOCOL = 1


class BadMessage(Exception):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_message"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class AgentSocket:
    """One WebSocket connection: one session, at most one reply in flight, tool calls alongside."""

    def __init__(self, ws: WebSocket, daemon, session: str):
        self.ws, self.daemon, self.session = ws, daemon, session
        self.dispatcher = Dispatcher(daemon)
        self._send_lock = asyncio.Lock()
        self._closed = False
        self.reply_job = None
        self.reply_id: Any = None
        self.reply_task: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()

    async def send(self, obj: dict) -> None:
        if self._closed:
            return
        async with self._send_lock:
            try:
                await self.ws.send_text(json.dumps(obj, ensure_ascii=False))
            except Exception:  # noqa: BLE001 - the client went away; the receive loop notices
                self._closed = True

    async def error(
        self, mid: Any, message: str, code: str = "invalid_message", param: str | None = None, hint: str | None = None
    ) -> None:
        err: dict[str, Any] = {"message": message, "code": code}
        if param:
            err["param"] = param
        if hint:
            err["hint"] = hint
        await self.send({"type": "error", "id": mid, "error": err})

    async def fail(self, mid: Any, exc: BaseException) -> None:
        await self.send({"type": "error", "id": mid, "error": error_json(exc)})

    # -- the loop ------------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send(
            {
                "type": "ready",
                "session": self.session,
                "model": self.daemon.model_id,
                "tools": list(STATE_TOOLS),
                "protocol": PROTOCOL,
            }
        )
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                await self.handle(message)
        finally:
            self._closed = True
            if self.reply_job is not None:
                self.reply_job.cancel.set()
            for task in list(self.tasks):
                task.cancel()

    async def handle(self, message: dict) -> None:
        mid = None
        try:
            msg = decode_message(message)
            mid = msg.get("id")
            if mid is not None and (isinstance(mid, bool) or not isinstance(mid, (str, int))):
                mid = None
                raise BadMessage("id: must be a string or an integer.", "id")
            kind = msg.get("type")
            if not isinstance(kind, str):  # a list or object here is unhashable: it must not reach the dict lookup
                raise BadMessage(
                    f"type: must be a string naming the message (chat, call, cancel or ping), not {_json_kind(kind)}.",
                    "type",
                )
            handler = {
                "chat": self.on_chat,
                "call": self.on_call,
                "cancel": self.on_cancel,
                "ping": self.on_ping,
                "auth": self.on_auth,
            }.get(kind)
            if handler is None:
                raise BadMessage(
                    f"type: unknown message type {str(kind)[:40]!r}; send chat, call, cancel or ping.", "type"
                )
            await handler(mid, msg)
        except BadMessage as e:
            await self.error(mid, e.message, e.code, e.param)
        except EngramError as e:
            await self.fail(mid, e)
        except Exception as e:  # noqa: BLE001 - a defect in one message's handling must not drop the connection
            log.exception("agent WebSocket message failed")
            await self.error(mid, f"internal error: {type(e).__name__}: {e}", "internal_error")

    async def on_ping(self, mid: Any, msg: dict) -> None:
        await self.send({"type": "pong", "id": mid})

    async def on_auth(self, mid: Any, msg: dict) -> None:
        raise BadMessage("already authenticated; auth is only the first message.", "type")

    async def on_cancel(self, mid: Any, msg: dict) -> None:
        job = self.reply_job
        if job is not None:
            job.cancel.set()
        await self.send({"type": "cancelled", "id": mid, "reply_id": self.reply_id if job is not None else None})

    async def on_call(self, mid: Any, msg: dict) -> None:
        tool = msg.get("tool")
        if not isinstance(tool, str):
            raise BadMessage("tool: required, the tool's name (a string).", "tool")
        unknown = set(msg) - {"type", "id", "tool", "arguments"}
        if unknown:
            raise BadMessage(
                f"{sorted(unknown)[0]}: unknown field of a call message (type, id, tool, arguments).",
                sorted(unknown)[0],
            )

        async def run() -> None:
            try:
                result = await self.dispatcher.call(tool, msg.get("arguments"), session=self.session)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # noqa: BLE001 - every failure is an error event
                if not isinstance(e, EngramError):
                    log.exception("agent tool %s failed", tool)
                await self.fail(mid, e)
                return
            await self.send({"type": "result", "id": mid, "tool": tool, "result": result})

        self._spawn(run())

    async def on_chat(self, mid: Any, msg: dict) -> None:
        if self.reply_job is not None:
            raise BadMessage(
                "a reply is already being generated on this connection; wait for its done, or cancel it.", code="busy"
            )
        messages = _chat_messages(msg)
        try:
            sampling = Sampling.model_validate(
                {k: v for k, v in msg.items() if k not in ("type", "id", "content", "messages")}
            )
        except ValidationError as e:
            message, param = validation_problem(e.errors())
            raise BadMessage(f"{message}.", param or "chat") from None
        unknown = set(msg) - {"type", "id", "content", "messages"} - set(Sampling.model_fields)
        if unknown:
            raise BadMessage(f"{sorted(unknown)[0]}: unknown field of a chat message.", sorted(unknown)[0])
        chat = ChatRequest(messages=messages, session=self.session, params=sampling.params())
        svc = self.daemon.service
        job = self.daemon.worker.submit(
            lambda job: svc.chat(chat, job), name="ws chat", turn=True, session=chat.session
        )
        self.reply_job, self.reply_id = job, mid
        self.reply_task = self._spawn(self._stream(job, mid))

    async def _stream(self, job, mid: Any) -> None:
        try:
            async for kind, value in job.events():
                if kind == "piece":
                    await self.send({"type": "token", "id": mid, "text": value})
                elif kind == "done":
                    r: TurnResult = value
                    await self.send(
                        {
                            "type": "done",
                            "id": mid,
                            "text": r.text,
                            "finish_reason": r.finish_reason,
                            "usage": usage_json(r),
                            "engram": engram_json(r),
                        }
                    )
                elif kind == "error":
                    await self.fail(mid, value)
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        finally:
            if self.reply_job is job:
                self.reply_job, self.reply_id = None, None

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task


def _json_kind(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", list: "a list", dict: "an object"}.get(type(value), "a number")


def decode_message(message: dict) -> dict:
    text = message.get("text")
    if text is None:
        data = message.get("bytes")
        try:
            text = data.decode("utf-8") if data is not None else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise BadMessage("send JSON objects as UTF-8 text frames.")
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadMessage(f"the message is not valid JSON ({e.msg} at position {e.pos}).", code="invalid_json") from None
    except (ValueError, RecursionError) as e:  # an integer of 4,300+ digits, nesting deeper than Python recurses
        raise BadMessage(
            f"the message is not JSON this server reads ({type(e).__name__}).", code="invalid_json"
        ) from None
    if not isinstance(msg, dict):
        raise BadMessage('a message must be a JSON object with a "type".')
    return msg


def _chat_messages(msg: dict) -> list[dict]:
    content, messages = msg.get("content"), msg.get("messages")
    if (content is None) == (messages is None):
        raise BadMessage("content: give the user message as content (a string), or messages (a list).", "content")
    if content is not None:
        if not isinstance(content, str) or not content:
            raise BadMessage("content: must be a non-empty string.", "content")
        return [{"role": "user", "content": content}]
    if not isinstance(messages, list) or not messages:
        raise BadMessage("messages: must be a non-empty list of {role, content}.", "messages")
    out = []
    for i, m in enumerate(messages):
        try:
            out.append(ChatMessage.model_validate(m).plain())
        except ValidationError as e:
            message, param = validation_problem(e.errors(), f"messages[{i}]")
            raise BadMessage(f"{message}.", param) from None
        except UsageError as e:
            raise BadMessage(f"messages[{i}]: {e.message}", f"messages[{i}]") from None
    return out
