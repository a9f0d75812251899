"""Agent routes: the tools of engramctl.agent over REST and WebSocket, and the model's own tool calls.

    GET  /v1/agent/tools     {"object": "list", "tools": [OpenAI function tools], "results": {name: JSON Schema}}
                             (?include_chat=true adds the `chat` tool)
    POST /v1/agent/call      {"tool": name, "arguments": {...}} -> {"tool": name, "result": {...}}; a failure is
                             a 4xx/5xx {"error": {"message", "code", "param", ...}} (param names a bad argument)
    WS   /v1/agent/ws        one connection = one conversation (a session); message schema below
    chat_with_tools          /v1/chat/completions with `tools` (routes_openai hands those requests here)

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
`ws-<hex>` one.
A wrong token in the header is refused with HTTP 401; a wrong or missing auth message closes with 1008.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.agent import calls as agent_calls
from engramctl.agent.tools import STATE_TOOLS, ToolArgumentError, error_json, openai_tools, result_schemas
from engramctl.daemon.auth import token_matches
from engramctl.daemon.context import daemon_of
from engramctl.daemon.dispatch import Dispatcher
from engramctl.daemon.errors import body_for, error_body, validation_problem
from engramctl.daemon.schemas import ChatMessage, Sampling
from engramctl.daemon.service import ChatRequest, ChatResult
from engramctl.daemon.streaming import SSE_HEADERS, Completion, engram_json, job_result, sse, usage_json
from engramctl.errors import EngramError, InvalidName, NotFound, UsageError
from engramctl.store.names import named_session, validate_session_name

log = logging.getLogger("engramctl.daemon")
router = APIRouter()

PROTOCOL = 1
AUTH_TIMEOUT_S = 10.0
WS_POLICY_VIOLATION = 1008


def _error_response(exc: BaseException) -> JSONResponse:
    status, body = body_for(exc)
    param = getattr(exc, "param", None)
    if param:
        body["error"]["param"] = param
    return JSONResponse(body, status_code=status)


# -- REST ------------------------------------------------------------------------------------------------------
@router.get("/v1/agent/tools")
async def agent_tools(include_chat: bool = False):
    return {
        "object": "list",
        "version": PROTOCOL,
        "tools": openai_tools(include_chat),
        "results": result_schemas(include_chat),
    }


class AgentCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tool: str
    arguments: dict[str, Any] | str | None = None


@router.post("/v1/agent/call")
async def agent_call(body: AgentCall, request: Request):
    d = daemon_of(request)
    try:
        result = await Dispatcher(d).call(body.tool, body.arguments, request=request)
    except EngramError as e:
        return _error_response(e)
    return {"tool": body.tool, "result": result}


# -- WebSocket -------------------------------------------------------------------------------------------------
class _Bad(Exception):
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
            msg = _decode(message)
            mid = msg.get("id")
            if mid is not None and (isinstance(mid, bool) or not isinstance(mid, (str, int))):
                mid = None
                raise _Bad("id: must be a string or an integer.", "id")
            kind = msg.get("type")
            if not isinstance(kind, str):  # a list or object here is unhashable: it must not reach the dict lookup
                raise _Bad(
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
                raise _Bad(f"type: unknown message type {str(kind)[:40]!r}; send chat, call, cancel or ping.", "type")
            await handler(mid, msg)
        except _Bad as e:
            await self.error(mid, e.message, e.code, e.param)
        except EngramError as e:
            await self.fail(mid, e)
        except Exception as e:  # noqa: BLE001 - a defect in one message's handling must not drop the connection
            log.exception("agent WebSocket message failed")
            await self.error(mid, f"internal error: {type(e).__name__}: {e}", "internal_error")

    async def on_ping(self, mid: Any, msg: dict) -> None:
        await self.send({"type": "pong", "id": mid})

    async def on_auth(self, mid: Any, msg: dict) -> None:
        raise _Bad("already authenticated; auth is only the first message.", "type")

    async def on_cancel(self, mid: Any, msg: dict) -> None:
        job = self.reply_job
        if job is not None:
            job.cancel.set()
        await self.send({"type": "cancelled", "id": mid, "reply_id": self.reply_id if job is not None else None})

    async def on_call(self, mid: Any, msg: dict) -> None:
        tool = msg.get("tool")
        if not isinstance(tool, str):
            raise _Bad("tool: required, the tool's name (a string).", "tool")
        unknown = set(msg) - {"type", "id", "tool", "arguments"}
        if unknown:
            raise _Bad(
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
            raise _Bad(
                "a reply is already being generated on this connection; wait for its done, or cancel it.", code="busy"
            )
        messages = _chat_messages(msg)
        try:
            sampling = Sampling.model_validate(
                {k: v for k, v in msg.items() if k not in ("type", "id", "content", "messages")}
            )
        except ValidationError as e:
            message, param = validation_problem(e.errors())
            raise _Bad(f"{message}.", param or "chat") from None
        unknown = set(msg) - {"type", "id", "content", "messages"} - set(Sampling.model_fields)
        if unknown:
            raise _Bad(f"{sorted(unknown)[0]}: unknown field of a chat message.", sorted(unknown)[0])
        chat = ChatRequest(messages=messages, session=self.session, params=sampling.params())
        svc = self.daemon.service
        job = self.daemon.worker.submit(lambda job: svc.chat(chat, job.emit, job.cancel), name="ws chat")
        self.reply_job, self.reply_id = job, mid
        self.reply_task = self._spawn(self._stream(job, mid))

    async def _stream(self, job, mid: Any) -> None:
        try:
            while True:
                kind, value = await job.events.get()
                if kind == "piece":
                    await self.send({"type": "token", "id": mid, "text": value})
                elif kind == "done":
                    r: ChatResult = value
                    await self.send(
                        {
                            "type": "done",
                            "id": mid,
                            "text": r.text,
                            "finish_reason": r.finish.reason,
                            "usage": usage_json(r),
                            "engram": engram_json(r),
                        }
                    )
                    return
                elif kind == "error":
                    await self.fail(mid, value)
                    return
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


def _decode(message: dict) -> dict:
    text = message.get("text")
    if text is None:
        data = message.get("bytes")
        try:
            text = data.decode("utf-8") if data is not None else None
        except UnicodeDecodeError:
            text = None
        if text is None:
            raise _Bad("send JSON objects as UTF-8 text frames.")
    try:
        msg = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Bad(f"the message is not valid JSON ({e.msg} at position {e.pos}).", code="invalid_json") from None
    except (ValueError, RecursionError) as e:  # an integer of 4,300+ digits, nesting deeper than Python recurses
        raise _Bad(f"the message is not JSON this server reads ({type(e).__name__}).", code="invalid_json") from None
    if not isinstance(msg, dict):
        raise _Bad('a message must be a JSON object with a "type".')
    return msg


def _chat_messages(msg: dict) -> list[dict]:
    content, messages = msg.get("content"), msg.get("messages")
    if (content is None) == (messages is None):
        raise _Bad("content: give the user message as content (a string), or messages (a list).", "content")
    if content is not None:
        if not isinstance(content, str) or not content:
            raise _Bad("content: must be a non-empty string.", "content")
        return [{"role": "user", "content": content}]
    if not isinstance(messages, list) or not messages:
        raise _Bad("messages: must be a non-empty list of {role, content}.", "messages")
    out = []
    for i, m in enumerate(messages):
        try:
            out.append(ChatMessage.model_validate(m).plain())
        except ValidationError as e:
            message, param = validation_problem(e.errors(), f"messages[{i}]")
            raise _Bad(f"{message}.", param) from None
        except UsageError as e:
            raise _Bad(f"messages[{i}]: {e.message}", f"messages[{i}]") from None
    return out


async def _deny(ws: WebSocket, status: int, message: str, code: str) -> None:
    body = error_body(message, status, code)
    headers = {"www-authenticate": "Bearer"} if status == 401 else None
    try:
        await ws.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
    except RuntimeError:  # the server cannot answer a handshake with HTTP: refuse it plainly
        await ws.close(WS_POLICY_VIOLATION, message[:120])


@router.websocket("/v1/agent/ws")
async def agent_ws(ws: WebSocket):
    d = ws.app.state.daemon
    header = ws.headers.get("authorization")
    if header is not None and not token_matches(header, d.token):
        return await _deny(ws, 401, "invalid API token: send 'Authorization: Bearer <token>'.", "authentication_error")
    try:
        session = named_session(ws.query_params.get("session"), ws.query_params.get("conversation_id"))
    except UsageError as e:
        return await _deny(ws, 400, f"session: {e.message}", e.kind)
    await ws.accept()
    if header is None:
        session, ok = await _first_message_auth(ws, d.token, session)
        if not ok:
            return
    conn = AgentSocket(ws, d, session or f"ws-{secrets.token_hex(6)}")
    await conn.run()


async def _first_message_auth(ws: WebSocket, token: str, session: str | None) -> tuple[str | None, bool]:
    async def refuse(message: str, code: str = "authentication_error") -> tuple[None, bool]:
        try:
            await ws.send_text(json.dumps({"type": "error", "id": None, "error": {"message": message, "code": code}}))
            await ws.close(WS_POLICY_VIOLATION, message[:120])
        except Exception:  # noqa: BLE001
            pass
        return None, False

    try:
        message = await asyncio.wait_for(ws.receive(), AUTH_TIMEOUT_S)
    except asyncio.TimeoutError:
        return await refuse(f"no auth message within {AUTH_TIMEOUT_S:.0f} s.")
    if message["type"] == "websocket.disconnect":
        return None, False
    try:
        msg = _decode(message)
    except _Bad as e:
        return await refuse(f'the first message must be {{"type": "auth", "token": ...}}: {e.message}')
    given = msg.get("token")
    if msg.get("type") != "auth" or not isinstance(given, str):
        return await refuse(
            'missing API token: send {"type": "auth", "token": "..."} first, '
            "or an 'Authorization: Bearer <token>' header."
        )
    if not token_matches(f"Bearer {given}", token):
        return await refuse("invalid API token.")
    named = msg.get("session")
    if named is not None:
        try:
            named = validate_session_name(named)
        except InvalidName as e:
            return await refuse(f"session: {e.message}", "invalid_name")
        if session is not None and named != session:
            return await refuse(
                "session: the query string and the auth message name different sessions.", "invalid_request_error"
            )
    return named or session, True


# -- the model's own tool calls (/v1/chat/completions with `tools`) --------------------------------------------
async def chat_with_tools(body, request: Request):
    """A chat completion whose request declares tools: the model sees them in a system message; engram
    tools it calls run in its session, the client's own are handed back (see engramctl.agent.calls)."""
    d = daemon_of(request)
    tools = agent_calls.request_tools(body.tools or [])
    choice = "auto" if body.tool_choice is None else body.tool_choice
    messages = agent_calls.plain_messages(body.messages)
    if choice != "none":
        transcript: list[dict] = []
        if body.session_name is not None:
            try:
                transcript = d.store.transcripts.of_session(body.session_name)
            except NotFound:
                pass
        messages = agent_calls.with_tools_message(messages, transcript, agent_calls.tools_message(tools))
    chat = ChatRequest(messages=messages, session=body.session_name, params=body.params())
    job = d.worker.submit(lambda job: d.service.chat(chat, job.emit, job.cancel), name="chat")
    completion = Completion(d.model_id, d.engine.info.fingerprint)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    result: ChatResult = await job_result(job, request)
    content, parsed = (result.text, []) if choice == "none" else agent_calls.parse_tool_calls(result.text, tools.names)
    response = completion.response(result)
    if parsed:
        ext = engram_json(result)
        ext["tool_results"], ext["tool_messages"] = await _execute(d, parsed, tools, ext.get("session"))
        response["choices"][0]["message"] = {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [c.openai() for c in parsed],
        }
        response["choices"][0]["finish_reason"] = "tool_calls"
        response["engram"] = ext
    if not body.stream:
        return JSONResponse(response)
    return StreamingResponse(
        _replay(completion, response, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _execute(d, parsed, tools, session: str | None) -> tuple[list[dict], list[dict]]:
    results, messages = [], []
    dispatcher = Dispatcher(d)
    for call in parsed:
        if call.name not in tools.engram:
            continue  # the client's own function: it runs it
        try:
            if call.error is not None:
                raise ToolArgumentError(call.error, "arguments")
            result = await dispatcher.call(call.name, call.arguments, session=session)
            results.append({"tool_call_id": call.id, "name": call.name, "ok": True, "result": result})
            messages.append(agent_calls.tool_message(call, result))
        except EngramError as e:
            err = error_json(e)
            results.append({"tool_call_id": call.id, "name": call.name, "ok": False, "error": err})
            messages.append(agent_calls.tool_message(call, {"error": err}))
    return results, messages


async def _replay(completion: Completion, response: dict, include_usage: bool):
    """A finished completion as SSE chunks (a reply that may hold tool calls is parsed whole first)."""
    choice = response["choices"][0]
    message, reason = choice["message"], choice["finish_reason"]
    yield sse(completion.chunk({"role": "assistant", "content": ""}))
    if message.get("content"):
        yield sse(completion.chunk({"content": message["content"]}))
    if message.get("tool_calls"):
        deltas = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        yield sse(completion.chunk({"tool_calls": deltas}))
    yield sse(completion.chunk({}, reason, engram=response["engram"]))
    if include_usage:
        yield sse(completion.usage_chunk(response["usage"]))
    yield "data: [DONE]\n\n"
