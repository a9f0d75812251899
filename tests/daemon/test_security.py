"""Security (issue 12 item 7), against a real daemon process: every HTTP route (as its own /openapi.json
lists them, so a new route is covered the day it is added), the WebSocket and the MCP bridge need the
token, compared in constant time; the files the daemon writes are 0600 and its dirs 0700; no name, label,
import file or header field writes outside the data dir; a non-loopback bind needs the explicit opt-in.

tests/daemon/test_app.py keeps the in-process checks (token file creation, check_host's rules)."""

from __future__ import annotations

import ast
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import snapshot_mutations as mut
from tests.daemon.conftest import ROOT, daemon_env, start_daemon

WRONG_AUTH = [
    None,
    "",
    "Bearer",
    "Bearer {token} {token}",
    "Bearer wrong",
    "Basic {token}",
    "Bearer {token}x",
    "Bearer x{token}",
    "Bearer {token_prefix}",
    "Token {token}",
    "Bearer {token_upper}",
]


@pytest.fixture(scope="module")
def daemon(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("security")
    d = start_daemon(model_dir, root / "home")
    d.root = root
    try:
        with d.http() as c:
            r = c.post(
                "/v1/chat/completions",
                json={"session": "sec", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200, r.text
        yield d
    finally:
        d.stop()


def _headers(template: str | None, token: str) -> dict[str, str]:
    if template is None:
        return {}
    value = template.format(token=token, token_prefix=token[:-1], token_upper=token.upper())
    return {"Authorization": value}


def test_every_http_route_needs_the_token(daemon):
    with daemon.http() as c:
        doc = c.get("/openapi.json").json()
    routes = [(m.upper(), re.sub(r"\{[^}]+\}", "x", p)) for p, ops in doc["paths"].items() for m in ops]
    routes += [("GET", "/openapi.json"), ("GET", "/docs"), ("GET", "/no/such/route"), ("POST", "/v1/agent/ws")]
    assert len(routes) >= 28
    with httpx.Client(base_url=daemon.url, timeout=30) as anonymous:
        assert anonymous.get("/health").status_code == 200  # the only public route
        for method, path in routes:
            if path == "/health":
                continue
            for template in WRONG_AUTH:
                r = anonymous.request(method, path, headers=_headers(template, daemon.token), content=b"{}")
                assert r.status_code == 401, (method, path, template, r.status_code, r.text)
                assert r.headers["www-authenticate"] == "Bearer"
                assert r.json()["error"]["code"] == "authentication_error"
                assert daemon.token not in r.text


def test_the_websocket_needs_the_token(daemon):
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect

    url = daemon.url.replace("http://", "ws://") + "/v1/agent/ws"
    for template in WRONG_AUTH[1:]:  # a wrong Authorization header: refused at the handshake
        with pytest.raises(InvalidStatus) as e:
            with connect(url, additional_headers=_headers(template, daemon.token)):
                pass
        assert e.value.response.status_code == 401, template
    first_messages = [
        {"type": "chat", "content": "hi"},
        {"type": "auth"},
        {"type": "auth", "token": None},
        {"type": "auth", "token": "wrong"},
        {"type": "auth", "token": daemon.token + "x"},
        {"type": "auth", "token": daemon.token[:-1]},
        {"type": "auth", "token": [daemon.token]},
    ]
    for first in first_messages:  # no header: the first message must authenticate, else close 1008
        with connect(url) as ws:
            ws.send(json.dumps(first))
            event = json.loads(ws.recv(timeout=15))
            assert event["type"] == "error" and event["error"]["code"] == "authentication_error", (first, event)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=15)
            assert closed.value.rcvd.code == 1008
    with connect(url) as ws:
        ws.send(json.dumps({"type": "auth", "token": daemon.token}))
        assert json.loads(ws.recv(timeout=15))["type"] == "ready"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_mcp_bridge_needs_the_token(daemon, anyio_backend):
    """`engramctl mcp` is a client of the daemon: with the wrong token every tool call is refused by the
    daemon (an error result naming the token), with the right one it works."""
    from mcp import Client, StdioServerParameters

    async def call(env: dict) -> tuple[bool, str]:
        params = StdioServerParameters(
            command=sys.executable, args=["-m", "engramctl", "mcp", "--session", "sec"], env=env, cwd=str(ROOT)
        )
        async with Client(params, read_timeout_seconds=60) as client:
            result = await client.call_tool("session_info", {})
            return result.is_error, result.content[0].text

    env = daemon_env(daemon.home)
    is_error, text = await call({**env, "ENGRAM_API_KEY": "wrong-token"})
    assert is_error and "API token" in text, text
    is_error, text = await call(env)  # the token file in the config dir
    assert not is_error and json.loads(text)["session"] == "sec", text


def test_token_compare_is_constant_time(monkeypatch):
    """The one compare (auth.token_matches, used by the HTTP middleware and both WebSocket paths) is
    hmac.compare_digest, and no daemon, client or MCP module compares a token with == or !=."""
    import hmac

    from engramctl.daemon import auth

    seen = []
    real = hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or real(a, b))
    assert auth.token_matches("Bearer secret", "secret") and not auth.token_matches("Bearer secreT", "secret")
    assert seen == [(b"secret", b"secret"), (b"secreT", b"secret")]
    agent = (ROOT / "engramctl/daemon/routes_agent.py").read_text()
    assert agent.count("token_matches(") >= 2 and "compare_digest" not in agent
    files = [*sorted((ROOT / "engramctl/daemon").glob("*.py")), ROOT / "engramctl/cli/mcp_server.py"]
    files += sorted((ROOT / "engramctl/client").glob("*.py"))
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
                for x in (node.left, *node.comparators):
                    name = x.id if isinstance(x, ast.Name) else x.attr if isinstance(x, ast.Attribute) else ""
                    assert name not in ("token", "api_key") and not name.endswith("_token"), (f.name, node.lineno)


# -- nothing written outside the data dir ---------------------------------------------------------------------
HOSTILE = ["../../evil", "..", "/etc/evil", "a/b", "..\\evil", "evil\x00", "%2e%2e%2fevil", "~/evil", "evil/"]


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def _export_with(base: bytes, **meta: str) -> bytes:
    header, data = mut.split(base)
    header["__metadata__"].update(meta)
    return mut.seal(header, data)


def test_no_name_label_or_file_writes_outside_the_data_dir(daemon):
    before = _tree(daemon.root)
    with daemon.http() as c:
        sid = c.get("/v1/sessions/sec").json()["head"]
        base = (daemon.home / "snapshots" / f"{sid}.safetensors").read_bytes()
        for bad in HOSTILE:
            for path, body in (
                (
                    "/v1/chat/completions",
                    {"session": bad, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                ),
                (
                    "/v1/chat/completions",
                    {"conversation_id": bad, "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                ),
                ("/save_snapshot", {"session": "sec", "label": bad}),
                ("/save_snapshot", {"conversation_id": "sec", "snapshot_id": bad}),
                ("/save_snapshot", {"conversation_id": "sec", "branch_name": bad}),
                ("/branch_snapshot", {"source": "sec", "new_session": bad}),
                ("/label_snapshot", {"snapshot_id": sid, "label": bad}),
                ("/get_snapshot_info", {"snapshot_id": bad}),
                ("/delete_snapshot", {"snapshot_id": bad}),
            ):
                r = c.post(path, json=body)
                assert r.status_code < 500, (path, body, r.text)
            r = c.post("/import_snapshot", params={"session": bad}, content=base)
            assert r.status_code == 400, r.text
            r = c.post("/import_snapshot", params={"label": bad, "session": "imp-label"}, content=base)
            assert r.status_code in (200, 400, 409), r.text
            c.delete("/v1/sessions/imp-label")
            for key in ("session", "snapshot_id", "parent", "created", "model_id", "transcript", "text"):
                r = c.post("/import_snapshot", content=_export_with(base, **{key: bad}))
                assert r.status_code < 500, (key, bad, r.text)
                if r.status_code == 200:
                    c.delete(f"/v1/sessions/{r.json()['session']}")
            header, data = mut.split(base)  # a tensor named like a path
            header[bad] = header.pop("token_ids")
            r = c.post("/import_snapshot?session=imp-tensor", content=mut.seal(header, data))
            assert r.status_code in (400, 409), r.text
    new = _tree(daemon.root) - before
    outside = [p for p in new if daemon.home not in p.parents]
    assert not outside, outside
    names = re.compile(r"[0-9a-f]{32}\.safetensors")
    for p in new:
        rel = p.relative_to(daemon.home)
        assert rel.parts[0] in ("snapshots", "index.db-wal", "index.db-shm", "logs", "quarantine"), rel
        if rel.parts[0] == "snapshots" and p.is_file():
            assert names.fullmatch(p.name), p
    assert not [p for p in daemon.root.rglob("*evil*")]


def test_files_are_0600_and_dirs_0700(daemon):
    """Everything under the daemon's home after turns, saves, branches and imports (run last in this module:
    it sees what the tests above made). The daemon's log, written by the test harness, is not the daemon's."""
    with daemon.http() as c:
        c.post("/save_snapshot", json={"session": "sec", "label": "perm"}).raise_for_status()
        c.post("/branch_snapshot", json={"source": "sec", "new_session": "sec-b"}).raise_for_status()
    checked = 0
    for p in [daemon.home, *daemon.home.rglob("*")]:
        if p.parent == daemon.home and p.name.startswith("daemon-") and p.suffix == ".log":
            continue
        mode = stat.S_IMODE(p.lstat().st_mode)
        want = 0o700 if p.is_dir() else 0o600
        assert mode == want, (str(p.relative_to(daemon.home)), oct(mode))
        checked += 1
    assert checked >= 10
    assert (daemon.home / "run" / "daemon.json").exists()  # regression: it was written 0644


# -- the bind --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_a_non_loopback_bind_needs_the_opt_in(host, model_dir, tmp_path):
    env = daemon_env(tmp_path / "home")
    cmd = [sys.executable, "-m", "engramctl.daemon", "--model", str(model_dir), "--host", host, "--port", "0"]
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "refusing to listen" in proc.stderr and "--allow-remote" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "run" / "daemon.json").exists()
    cli = [sys.executable, "-m", "engramctl", "daemon", "start", "--model", str(model_dir), "--host", host]
    proc = subprocess.run(cli, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "refusing to listen" in proc.stderr.lower(), proc.stderr
    assert not (tmp_path / "home" / "run" / "daemon.json").exists()


def test_allow_remote_is_an_explicit_opt_in(model_dir, tmp_path):
    """ENGRAM_ALLOW_REMOTE=0 (or the config saying false) is no opt-in; the flag itself is."""
    env = {**daemon_env(tmp_path / "home"), "ENGRAM_ALLOW_REMOTE": "0"}
    cmd = [sys.executable, "-m", "engramctl.daemon", "--model", str(model_dir), "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "refusing to listen" in proc.stderr
