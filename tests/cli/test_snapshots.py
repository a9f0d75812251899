"""`engramctl snapshots ...` in human, --json and -q: reads against the store without a daemon, and
through a daemon (tests.helpers.inprocess, real HTTP) every change and the reads beside it."""

from __future__ import annotations

import json
import re

import pytest

from engramctl.cli import snapshots_rm
from tests.cli.conftest import seed_store


def test_ls_modes(cli, seeded):
    human = cli("snapshots", "ls")
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["ID", "SESSION", "TOKENS", "SIZE", "SHARED", "TIERS", "CREATED", "NOTES"]
    assert len(lines) == 1 + 5
    assert "│" not in human.stdout and "─" not in human.stdout  # borderless
    assert "KiB" in human.stdout and "disk" in human.stdout and "head" in human.stdout
    assert human.stderr == ""

    rows = cli.json("snapshots", "ls")
    assert [r["id"] for r in rows] == seeded.all_ids
    assert {r["session"] for r in rows} == {"demo", "other"}
    head = rows[[r["id"] for r in rows].index(seeded.sessions["demo"][-1])]
    assert head["head_of"] == ["demo"] and head["tiers"] == ["disk"] and head["durable"] is True

    quiet = cli("snapshots", "ls", "-q")
    assert quiet.stdout.split() == seeded.all_ids

    one = cli.json("snapshots", "ls", "--session", "other")
    assert [r["id"] for r in one] == seeded.sessions["other"]
    assert "SESSION" not in cli("snapshots", "ls", "-s", "other").stdout.splitlines()[0]


def test_ls_empty_and_unknown_session(cli):
    r = cli("snapshots", "ls")
    assert r.stdout == "" and "No snapshots yet" in r.stderr
    assert cli.json("snapshots", "ls") == []
    assert cli("snapshots", "ls", "-q").stdout == ""
    bad = cli("snapshots", "ls", "--session", "nope", code=1)
    assert bad.stdout == "" and bad.stderr.startswith("Error: ") and "Hint: " in bad.stderr


def test_json_and_quiet_conflict(cli):
    r = cli("snapshots", "ls", "--json", "-q", code=2)
    assert "Error:" in r.stderr


def test_info_modes_and_prefixes(cli, seeded):
    sid = seeded.sessions["demo"][0]
    human = cli("snapshots", "info", sid)
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in human.stdout.splitlines())
    assert shown["ID"] == sid and shown["SESSION"] == "demo" and shown["CHECKSUM"].startswith("xxh3_128:")
    info = cli.json("snapshots", "info", seeded.prefix(sid))
    assert info["id"] == sid and info["n_tokens"] == 8 and info["path"].endswith(f"{sid}.safetensors")
    # from the file's header; a file without a backend key was written by the transformers backend
    assert (info["backend"], info["dtype"], info["state_format"]) == ("transformers", "float32", None)
    assert shown["BACKEND"] == "transformers" and shown["DTYPE"] == "float32" and shown["STATE FORMAT"] == "-"
    assert cli("snapshots", "info", sid, "-q").stdout.strip() == sid
    # ids start with a millisecond timestamp: a short prefix shared by several ids is ambiguous
    ambiguous = cli("snapshots", "info", sid[:6], code=2)
    assert "give more characters" in ambiguous.stderr or "matches" in ambiguous.stderr
    assert "too short" in cli("snapshots", "info", sid[:5], code=2).stderr
    assert cli("snapshots", "info", "f" * 12, code=1).stderr.startswith("Error: No snapshot id starts with")
    assert "not a snapshot id" in cli("snapshots", "info", "../etc", code=2).stderr


def test_id_prefixes_follow_the_stores_rule(cli, seeded):
    """The CLI has no prefix rule of its own: store.names.MIN_ID_PREFIX, as the daemon and agent tools."""
    from engramctl.store.names import MIN_ID_PREFIX

    sid = seeded.sessions["other"][0]
    short = cli("snapshots", "info", sid[: MIN_ID_PREFIX - 1], code=2).stderr
    assert "too short" in short and f"at least {MIN_ID_PREFIX}" in short
    typed_loosely = "  " + seeded.prefix(sid).upper() + " "
    assert cli("snapshots", "info", typed_loosely, "-q").stdout.strip() == sid
    missing = "0" * MIN_ID_PREFIX
    assert cli("snapshots", "info", missing, code=1).stderr.startswith(f"Error: No snapshot id starts with '{missing}'")


def test_rm_preview_dry_run_yes(cli, seeded, daemon):
    old = seeded.sessions["demo"][0]
    dry = cli("snapshots", "rm", old, "--dry-run")
    assert "Will delete 1 snapshot(s), freeing" in dry.stderr and old[:12] in dry.stdout
    assert "nothing deleted" in dry.stderr.lower()
    assert cli.json("snapshots", "rm", old, "--dry-run")["dry_run"] is True
    assert old in cli("snapshots", "ls", "-q").stdout

    done = cli.json("snapshots", "rm", old, "--yes")
    assert done["deleted"] == [old] and done["freed_bytes"] > 0 and done["dry_run"] is False
    assert old not in cli("snapshots", "ls", "-q").stdout

    second = seeded.sessions["demo"][1]
    q = cli("snapshots", "rm", second, "--yes", "-q")
    assert q.stdout.split() == [second]


def test_rm_refuses_without_terminal_and_asks_on_one(cli, seeded, daemon, monkeypatch):
    old = seeded.sessions["demo"][0]
    refused = cli("snapshots", "rm", old, input="y\n", code=2)
    assert "stdin is not a terminal" in refused.stderr and "--yes" in refused.stderr
    assert old in cli("snapshots", "ls", "-q").stdout

    monkeypatch.setattr(snapshots_rm, "stdin_is_tty", lambda: True)
    no = cli("snapshots", "rm", old, input="n\n", code=1)
    assert "[y/N]" in no.stderr and "Nothing deleted" in no.stderr
    assert old in cli("snapshots", "ls", "-q").stdout
    yes = cli("snapshots", "rm", old, input="y\n")
    assert "Deleted 1 snapshot(s)" in yes.stderr
    assert old not in cli("snapshots", "ls", "-q").stdout


def test_rm_in_use_needs_force(cli, seeded, daemon):
    head = seeded.sessions["demo"][-1]
    r = cli("snapshots", "rm", head, "--yes", code=2)
    assert "in use" in r.stderr and "head of demo" in r.stderr and "--force" in r.stderr
    forced = cli.json("snapshots", "rm", head, "--yes", "--force")
    assert forced["deleted"] == [head]
    # the session fell back to the parent snapshot
    rows = cli.json("snapshots", "ls", "--session", "demo")
    assert rows[-1]["head_of"] == ["demo"]


def test_rm_session(cli, seeded, daemon):
    cli("snapshots", "branch", seeded.sessions["demo"][0], "fork")
    preview = cli("snapshots", "rm", "--session", "demo", "--dry-run")
    assert "Will delete session 'demo': 2 snapshot(s)" in preview.stderr
    assert "1 snapshot(s) stay" in preview.stderr
    data = cli.json("snapshots", "rm", "--session", "demo", "--dry-run")
    assert data["kept_for_branches"] == [seeded.sessions["demo"][0]] and data["messages"] == 6
    cli("snapshots", "rm", "--session", "demo", code=2)  # stdin not a terminal
    done = cli.json("snapshots", "rm", "--session", "demo", "--yes")
    assert sorted(done["deleted"]) == sorted(seeded.sessions["demo"][1:])
    sessions = {s["name"] for s in cli.json("ps")["sessions"]}
    assert sessions == {"fork", "other"}
    cli("snapshots", "rm", "--session", "demo", "--yes", code=1)


def test_rm_usage(cli, seeded):
    assert "one of the two" in cli("snapshots", "rm", code=2).stderr
    assert "one of the two" in cli("snapshots", "rm", seeded.all_ids[0], "--session", "demo", code=2).stderr


def test_branch_from_session_and_prefix(cli, seeded, daemon):
    human = cli("snapshots", "branch", "demo", "fork1")
    assert "Created session 'fork1' from session 'demo'" in human.stderr and human.stdout == ""
    first = seeded.sessions["demo"][0]
    data = cli.json("snapshots", "branch", first[:16], "fork2")
    assert data["name"] == "fork2" and data["head"] == first
    assert cli("snapshots", "branch", "other", "fork3", "-q").stdout.strip() == "fork3"
    assert "already exists" in cli("snapshots", "branch", "demo", "fork1", code=2).stderr
    assert cli("snapshots", "branch", "nosuch", "x", code=1).stderr.startswith("Error: No session or snapshot")


def test_pin_unpin(cli, seeded, daemon):
    sid = seeded.sessions["other"][0]
    r = cli("snapshots", "pin", sid, "--label", "before refactor")
    assert "Pinned" in r.stderr and r.stdout == ""
    info = cli.json("snapshots", "info", sid)
    assert info["pinned"] is True and info["label"] == "before refactor"
    assert "pinned" in cli("snapshots", "ls").stdout
    assert cli.json("snapshots", "unpin", sid)["pinned"] is False
    assert cli("snapshots", "pin", sid, "-q").stdout.strip() == sid
    assert cli("snapshots", "unpin", sid, "-q").stdout.strip() == sid
    assert "Unpinned" in cli("snapshots", "unpin", sid).stderr


def test_export_without_a_daemon(cli, seeded, tmp_path):
    """Export is a read: the stored file and the snapshot's own transcript, no daemon needed."""
    sid = seeded.sessions["demo"][1]
    out = tmp_path / "x.safetensors"
    r = cli("snapshots", "export", sid, str(out))
    assert out.is_file() and "Exported" in r.stderr
    assert "already exists" in cli("snapshots", "export", sid, str(out), code=2).stderr
    data = cli.json("snapshots", "export", sid, str(out), "--force")
    assert data["messages"] == 4 and data["n_tokens"] == 16
    assert cli("snapshots", "export", sid, str(out), "--force", "-q").stdout.strip() == str(out)


def _talk(cli, daemon, session: str, *questions: str) -> list[str]:
    """Real turns of the daemon's model (an import must fit it), written to disk: their snapshot ids."""
    from engramctl.client import Client

    with Client(daemon.settings, autostart=False) as c:
        for q in questions:
            c.chat([{"role": "user", "content": q}], session=session, max_tokens=3, temperature=0)
    daemon.store.flush()
    return [s["id"] for s in cli.json("snapshots", "ls", "--session", session)]


def test_export_import_roundtrip(cli, daemon, tmp_path):
    sid = _talk(cli, daemon, "talk", "Hello there", "Tell me more")[-1]
    out = tmp_path / "x.safetensors"
    exported = cli.json("snapshots", "export", sid, str(out))
    assert exported["messages"] == 4 and exported["id"] == sid

    assert "already exists" in cli("snapshots", "import", str(out), code=2).stderr  # session 'talk' exists
    imp = cli.json("snapshots", "import", str(out), "--session", "restored", "--label", "imported")
    assert imp["session"] == "restored" and imp["n_tokens"] == exported["n_tokens"] and imp["messages"] == 4
    assert imp["label"] == "imported" and imp["file"] == str(out.resolve())
    q = cli("snapshots", "import", str(out), "--session", "restored2", "-q")
    assert len(q.stdout.strip()) == 32
    h = cli("snapshots", "import", str(out), "--session", "restored3")
    assert "Imported x.safetensors as session 'restored3'" in h.stderr


def test_import_rejects_damaged_file(cli, daemon, tmp_path):
    out = tmp_path / "x.safetensors"
    cli("snapshots", "export", _talk(cli, daemon, "talk", "Hello there")[0], str(out))
    raw = bytearray(out.read_bytes())
    raw[-5] ^= 0xFF
    out.write_bytes(bytes(raw))
    r = cli("snapshots", "import", str(out), "--session", "bad", code=1)
    assert "checksum" in r.stderr and r.stderr.startswith("Error: ")
    assert "bad" not in {s["name"] for s in cli.json("ps")["sessions"]}
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a snapshot at all")
    assert cli("snapshots", "import", str(junk), "--session", "bad", code=1).stderr.startswith("Error: ")


def test_gc_modes(cli, monkeypatch, tiny_engine):
    from tests.helpers.inprocess import InProcessDaemon

    monkeypatch.setenv("ENGRAM_KEEP_LAST", "1")
    ids = seed_store({"long": 4}).sessions["long"]
    with InProcessDaemon(tiny_engine("transformers")):  # started after the env it reads
        assert len(cli("snapshots", "ls", "-q").stdout.split()) >= 1
        res = cli.json("snapshots", "gc")
        assert set(res["deleted"]) <= set(ids[:-1])
        assert ids[-1] in cli("snapshots", "ls", "-q").stdout
        h = cli("snapshots", "gc")
        assert h.stderr.startswith("Deleted 0 snapshot(s)")
        assert cli("snapshots", "gc", "-q").stdout == ""


def test_changes_need_the_daemon(cli, seeded):
    """Every change goes through the daemon; with none running and autostart off (ENGRAM_NO_AUTOSTART,
    set for every test), it is exit code 3 with the way to start one, and nothing changes."""
    sid = seeded.sessions["demo"][0]
    before = cli.json("snapshots", "ls")
    for args in (
        ["rm", sid, "--yes"],
        ["rm", "--session", "other", "--yes"],
        ["branch", "demo", "fork"],
        ["pin", sid],
        ["unpin", sid],
        ["gc"],
    ):
        r = cli("snapshots", *args, code=3)
        assert r.stderr.startswith("Error: No engramctl daemon answers at "), (args, r.stderr)
        assert "Hint: start it with `engramctl daemon start`" in r.stderr and "ENGRAM_NO_AUTOSTART" in r.stderr
    assert cli.json("snapshots", "ls") == before


def test_reads_are_the_same_with_and_without_a_daemon(cli, seeded, tiny_engine):
    """One listing, two sources: the store's rows without a daemon are the daemon's rows."""
    from tests.helpers.inprocess import InProcessDaemon

    sid = seeded.sessions["demo"][1]
    local = cli.json("snapshots", "ls"), cli.json("snapshots", "info", sid[:12]), cli.json("sessions")
    with InProcessDaemon(tiny_engine("transformers")):
        remote = cli.json("snapshots", "ls"), cli.json("snapshots", "info", sid[:12]), cli.json("sessions")
    assert remote[0] == local[0] and remote[1] == local[1]
    assert [{k: v for k, v in s.items() if k != "hot"} for s in remote[2]] == local[2]
    assert [s["hot"] for s in remote[2]] == [False, False]  # the daemon says what it holds in memory


def test_path(cli, engram_home):
    assert cli("snapshots", "path").stdout.strip() == str(engram_home.resolve())
    data = cli.json("snapshots", "path")
    assert data["index"].endswith("index.db") and data["config_dir"].startswith(str(engram_home.resolve()))
    assert cli("snapshots", "path", "-q").stdout.strip() == str(engram_home.resolve())


@pytest.mark.parametrize("args", [["snapshots", "info"], ["snapshots", "pin"], ["snapshots", "export", "abcdef"]])
def test_missing_arguments_are_usage_errors(cli, args):
    r = cli(*args, code=2)
    assert r.stderr.startswith("Error: ") and "--help" in r.stderr
    json.dumps(r.stderr)
