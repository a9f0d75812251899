"""`engramctl mcp` driven by the MCP SDK's own client over stdio. The server starts the daemon on the
first call that needs it (autostart), then checkpoints, branches, restores and chats through it."""

from __future__ import annotations

import json
import sys

import pytest
from mcp import Client, StdioServerParameters

from engramctl.agent.tools import TOOLS
from engramctl.daemon.background import daemon_status, stop_background
from engramctl.settings import load_settings
from tests.daemon.conftest import ROOT, daemon_env

GREEDY = {"temperature": 0, "max_tokens": 5}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def mcp_env(model_dir, tmp_path_factory):
    home = tmp_path_factory.mktemp("agent-mcp-home")
    env = daemon_env(home, ENGRAM_MODEL=str(model_dir), ENGRAM_DTYPE="float32", ENGRAM_DEVICE="cpu", ENGRAM_PORT="0")
    env.pop("ENGRAM_NO_AUTOSTART")  # the MCP server starts the daemon itself
    yield env
    stop_background(load_settings(env=env))


def data(result) -> dict:
    assert not result.is_error, result.content
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error
    return result.content[0].text


@pytest.mark.anyio
async def test_mcp_client_drives_engramctl_mcp(mcp_env):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "engramctl", "mcp", "--session", "agent"], env=mcp_env, cwd=str(ROOT)
    )
    settings = load_settings(env=mcp_env)
    async with Client(params, read_timeout_seconds=120) as client:
        assert "agent" in (client.instructions or "")
        listed = (await client.list_tools()).tools
        assert [t.name for t in listed] == list(TOOLS)
        for t in listed:  # the same definitions as every other transport
            assert t.description == TOOLS[t.name].description and t.output_schema == TOOLS[t.name].returns
            assert t.input_schema == TOOLS[t.name].input_schema(contextual=True)
        assert "session" not in next(t for t in listed if t.name == "checkpoint").input_schema["required"]

        # bad arguments are refused here, naming the field, before any daemon is started
        assert "label" in error_text(await client.call_tool("checkpoint", {"label": 5}))
        assert "unknown argument" in error_text(await client.call_tool("session_info", {"sesion": "x"}))
        assert "no tool named" in error_text(await client.call_tool("format_disk", {}))
        assert daemon_status(settings) is None

        first = data(await client.call_tool("chat", {"message": "Hello there", **GREEDY}))  # starts the daemon
        assert first["session"] == "agent" and first["usage"]["completion_tokens"] == 5 and not first["resumed"]
        assert daemon_status(settings)["ready"]
        cp = data(await client.call_tool("checkpoint", {"label": "start"}))
        assert cp["snapshot_id"] == first["snapshot_id"] and cp["pinned"]
        option_a = data(await client.call_tool("chat", {"message": "Option A", **GREEDY}))
        assert option_a["resumed"] and option_a["restored_tokens"] == cp["tokens"]

        branch = data(await client.call_tool("branch", {"new_session": "agent-b", "checkpoint": "start"}))
        assert branch == {
            "session": "agent-b",
            "source_session": "agent",
            "snapshot_id": cp["snapshot_id"],
            "tokens": cp["tokens"],
            "n_messages": 2,
        }
        info = data(await client.call_tool("session_info", {"session": "agent-b"}))
        assert info["head"] == cp["snapshot_id"] and info["tokens"] == cp["tokens"] and info["snapshot_bytes"] > 0
        in_b = data(await client.call_tool("chat", {"session": "agent-b", "message": "Option A", **GREEDY}))
        assert in_b["reply"] == option_a["reply"]  # same point, same greedy reply

        restored = data(await client.call_tool("restore", {"checkpoint": "start"}))
        assert restored["snapshot_id"] == cp["snapshot_id"] and restored["previous_head"] == option_a["snapshot_id"]
        again = data(await client.call_tool("chat", {"message": "Option A", **GREEDY}))
        assert again["reply"] == option_a["reply"]

        checkpoints = data(await client.call_tool("list_checkpoints", {}))["checkpoints"]
        assert [c["label"] for c in checkpoints] == ["start"]
        assert "no checkpoint" in error_text(await client.call_tool("restore", {"checkpoint": "never"}))
        assert "already exists" in error_text(await client.call_tool("branch", {"new_session": "agent-b"}))
        deleted = data(await client.call_tool("delete_checkpoint", {"id": cp["snapshot_id"]}))
        assert deleted["snapshot_id"] == cp["snapshot_id"] and not deleted["deleted"]  # agent-b starts there
        assert data(await client.call_tool("list_checkpoints", {}))["checkpoints"] == []
