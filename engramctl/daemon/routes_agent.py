"""Agent routes: the tools of engramctl.agent over REST and WebSocket (the model's own tool calls on the chat
routes: tool_chat.py).

    GET  /v1/agent/tools     {"object": "list", "tools": [OpenAI function tools], "results": {name: JSON Schema}}
                             (?include_chat=true adds the `chat` tool)
    POST /v1/agent/call      {"tool": name, "arguments": {...}} -> {"tool": name, "result": {...}}; a failure is
                             a 4xx/5xx {"error": {"message", "code", "param", ...}} (param names a bad argument)
    WS   /v1/agent/ws        one connection = one conversation (a session); its messages: agent_socket.py

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
from starlette.responses import JSONResponse

from engramctl.agent.tools import openai_tools, result_schemas
from engramctl.daemon.agent_socket import PROTOCOL, AgentSocket, BadMessage, decode_message
from engramctl.daemon.auth import token_matches
from engramctl.daemon.context import daemon_of
from engramctl.daemon.dispatch import Dispatcher
from engramctl.daemon.errors import body_for, error_body
from engramctl.errors import EngramError, InvalidName, UsageError
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
