"""The server behind `engramctl mcp`: a Model Context Protocol server over stdio (the official `mcp` SDK)
exposing the agent tools (checkpoint, branch, restore, list_checkpoints, delete_checkpoint, session_info)
plus `chat`. It is a client of the daemon, like the rest of the CLI.

Every call goes to the daemon through engramctl.client (POST /v1/agent/call), which starts the daemon
on first use unless ENGRAM_NO_AUTOSTART is set. Arguments are checked here first against the same
schemas (engramctl.agent.tools), so a bad call fails at once, naming the field, without a daemon.

The server has a default session (--session, default "mcp"): a call that leaves out `session` (branch:
`source`) works on it. Tool failures are tool results with isError set and the daemon's message, so the
calling model can read them and correct itself. No torch here: the server starts in a moment.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from engramctl import __version__
from engramctl.agent.arguments import validate_arguments
from engramctl.agent.tools import TOOLS, get_tool
from engramctl.errors import EngramError, UnknownTool

log = logging.getLogger("engramctl.mcp")

DEFAULT_SESSION = "mcp"

INSTRUCTIONS = """engramctl keeps a local language model's conversation state (a session) and can checkpoint,
branch and restore it in milliseconds. `chat` talks to the model in a session; before a risky step call
`checkpoint` (with a label), explore alternatives with `branch` into new sessions, compare them, and go back
with `restore`. Calls without `session` use this server's session: {session!r}."""


def _text_result(types, payload: Any, *, error: bool = False):
    text = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    if error:
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=payload)


def build_server(call, session: str = DEFAULT_SESSION):
    """The MCP server. `call(tool, arguments) -> result` runs a tool (blocking; the daemon client)."""
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server

    tools = [
        types.Tool(
            name=t.name,
            description=t.description,
            input_schema=t.input_schema(contextual=True),
            output_schema=t.returns,
        )
        for t in TOOLS.values()
    ]

    async def list_tools(ctx, params) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx, params) -> Any:
        name = params.name
        try:
            tool = get_tool(name)
            args = validate_arguments(tool, params.arguments or {}, session=session)
        except UnknownTool as e:
            return _text_result(types, e.message, error=True)
        except EngramError as e:
            return _text_result(types, f"Invalid arguments: {e.message}", error=True)
        try:
            result = await anyio.to_thread.run_sync(lambda: call(tool.name, args))
        except EngramError as e:
            return _text_result(types, e.message + (f" (hint: {e.hint})" if e.hint else ""), error=True)
        except Exception as e:  # noqa: BLE001 - a tool failure is a result the model can read
            log.exception("tool %s failed", name)
            return _text_result(types, f"{type(e).__name__}: {e}", error=True)
        return _text_result(types, result)

    return Server(
        "engramctl",
        version=__version__,
        instructions=INSTRUCTIONS.format(session=session),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def _serve(server) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def run_stdio(settings, session: str = DEFAULT_SESSION) -> None:
    """Serve MCP on stdin/stdout until the client closes it."""
    import anyio

    from engramctl.client import Client

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")  # stderr
    client = Client(settings)
    try:
        anyio.run(_serve, build_server(client.agent_call, session))
    finally:
        client.close()
