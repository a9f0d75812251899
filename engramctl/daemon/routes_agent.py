"""Agent routes: the tools of engramctl.agent over REST and WebSocket, and the model's own tool calls.

    GET  /v1/agent/tools     {"object": "list", "tools": [OpenAI function tools], "results": {name: JSON Schema}}
                             (?include_chat=true adds the `chat` tool)
    POST /v1/agent/call      {"tool": name, "arguments": {...}} -> {"tool": name, "result": {...}}; a failure is
                             a 4xx/5xx {"error": {"message", "code", "param", ...}} (param names a bad argument)
    WS   /v1/agent/ws        one connection = one conversation (a session); its messages: agent_socket.py
    chat_with_tools          /v1/chat/completions with `tools` (routes_openai hands those requests here)

Here a WebSocket is authenticated (an Authorization header, else a first {"type": "auth"} message) and its
session named: `?session=NAME` (or `?conversation_id=`, or "session" in the auth message), else a new
`ws-<hex>` one; agent_socket.py's AgentSocket then runs the connection.
A wrong token in the header is refused with HTTP 401; a wrong or missing auth message closes with 1008.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from pydantic import BaseModel, ConfigDict
from starlette.responses import JSONResponse, StreamingResponse

from engramctl.agent import calls as agent_calls
from engramctl.agent.tools import error_json, openai_tools, result_schemas
from engramctl.daemon.agent_socket import PROTOCOL, AgentSocket, BadMessage, decode_message
from engramctl.daemon.auth import token_matches
from engramctl.daemon.context import daemon_of
from engramctl.daemon.dispatch import Dispatcher
from engramctl.daemon.errors import body_for, error_body
from engramctl.daemon.service import ChatRequest
from engramctl.daemon.streaming import SSE_HEADERS, Completion, job_result, sse
from engramctl.daemon.turn_json import engram_json
from engramctl.daemon.turn_result import TurnResult
from engramctl.errors import EngramError, InvalidName, NotFound, ToolArgumentError, UsageError
from engramctl.store.names import named_session, validate_session_name

router = APIRouter()

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


# -- WebSocket: the handshake (the connection itself is agent_socket.py) ----------------------------------
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
        msg = decode_message(message)
    except BadMessage as e:
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
    job = d.worker.submit(lambda job: d.service.chat(chat, job), name="chat", turn=True, session=chat.session)
    completion = Completion(d.model_id, d.engine.info.fingerprint)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    result: TurnResult = await job_result(job, request)
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
        _replay(
            completion,
            response,
            include_usage,
            trailer=chat.session is not None or "tool_results" in response["engram"],
        ),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
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


async def _replay(completion: Completion, response: dict, include_usage: bool, trailer: bool):
    """A finished completion as SSE chunks (a reply that may hold tool calls is parsed whole first), ending as
    streaming.py's: the finish, then (for a session, usage asked for, or tools the daemon ran: their results)
    the chunk without choices with the `engram` object."""
    choice = response["choices"][0]
    message, reason = choice["message"], choice["finish_reason"]
    yield sse(completion.chunk({"role": "assistant", "content": ""}))
    if message.get("content"):
        yield sse(completion.chunk({"content": message["content"]}))
    if message.get("tool_calls"):
        deltas = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
        yield sse(completion.chunk({"tool_calls": deltas}))
    yield sse(completion.chunk({}, reason))
    if trailer or include_usage:
        yield sse(completion.usage_chunk(response["usage"] if include_usage else None, engram=response["engram"]))
    yield "data: [DONE]\n\n"
