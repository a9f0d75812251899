"""`engramctl mcp`: serve the agent tools (checkpoint, branch, restore, ...) and `chat` to an MCP client
over stdio. The daemon is started on the first call if it is not running."""

from __future__ import annotations

from typing import Optional

import typer

from engramctl.cli import common
from engramctl.cli.complete import complete_session


def mcp(
    session: str = typer.Option(
        "mcp",
        "--session",
        "-s",
        metavar="NAME",
        autocompletion=complete_session,
        help="Session used by calls that do not name one.",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="MODEL", envvar="ENGRAM_MODEL", help="Model for the daemon, if this starts it."
    ),
) -> None:
    """Run a Model Context Protocol server on stdin/stdout exposing checkpoint, branch, restore,
    list_checkpoints, delete_checkpoint, session_info and chat. stdout carries only the protocol.

    \b
    Claude Desktop / Cursor / any MCP client:
      {"mcpServers": {"engramctl": {"command": "engramctl", "args": ["mcp", "--session", "agent"]}}}
    """
    from engramctl.cli.mcp_server import run_stdio
    from engramctl.store.names import validate_session_name

    st = common.settings(model=model)
    run_stdio(st, validate_session_name(session))
