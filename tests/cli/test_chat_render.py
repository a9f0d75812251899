"""Rendering of the chat (header, stream, NDJSON, Ctrl-C, slash commands, multi-line input) with a fake
daemon link. Only how things are printed is tested here; tests/cli/test_daemon_cli.py drives a real
daemon."""

from __future__ import annotations

import io
import json

import pytest

from engramctl.cli import repl as repl_mod
from engramctl.cli.conversation import ChatSession, describe_origin
from engramctl.cli.output import HUMAN, JSON, Output
from engramctl.errors import EngramError, NotFound


class FakeLink:
    model_id = "tiny/model"

    def __init__(self, pieces=("Hel", "lo", "!"), interrupt_after: int | None = None, resumed: dict | None = None):
        self.pieces, self.interrupt_after, self.resumed = pieces, interrupt_after, resumed
        self.sent: list[list[dict]] = []
        self.closed = 0
        self.saved: list = []
        self.sessions = {"s": []}

    def open_session(self, session):
        return self.resumed

    def stream(self, session, messages, sampling):
        self.sent.append(messages)
        try:
            yield {"type": "start", "engram": {"session": session, "resumed": False, "restored_tokens": 0}}
            for i, p in enumerate(self.pieces):
                if self.interrupt_after is not None and i == self.interrupt_after:
                    raise KeyboardInterrupt
                yield {"type": "token", "text": p}
            yield {
                "type": "done",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 10, "completion_tokens": len(self.pieces)},
                "engram": {"snapshot_id": "ab" * 16, "decode_ms": 30.0},
            }
        finally:
            self.closed += 1

    def save(self, session, label):
        self.saved.append((session, label))
        return {"id": "cd" * 16, "label": label, "n_tokens": 13, "nbytes": 4096}

    def branch(self, session, new):
        if new in self.sessions:
            raise NotFound("exists")
        self.sessions[new] = []

    def transcript(self, session):
        return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]

    def reset(self, session):
        return {"session": session, "kept_snapshots": 2, "previous_head": "ab" * 16}

    def settle(self, timeout=5.0):
        self.settled = True

    def head(self, session):
        return None

    def snapshot(self, sid):
        return {"id": sid, "nbytes": 2048, "n_tokens": 13}


def outputs(mode=HUMAN):
    o, e = io.StringIO(), io.StringIO()
    return Output(mode, stdout=o, stderr=e), o, e


def test_stream_to_stdout_header_to_stderr():
    out, o, e = outputs()
    link = FakeLink()
    chat = ChatSession(link, out, "s", system="be brief")
    res = chat.send("hi")
    assert o.getvalue() == "Hello!\n"
    assert e.getvalue().strip() == "tiny/model · session s · new session"
    assert link.sent[0][0] == {"role": "system", "content": "be brief"} and link.closed == 1
    assert res["completion_tokens"] == 3 and res["tokens_per_s"] == pytest.approx(100.0)
    chat.send("again")
    assert link.sent[1] == [{"role": "user", "content": "again"}]  # the system prompt goes first only
    assert e.getvalue().count("session s") == 1  # the header once


def test_json_events():
    out, o, e = outputs(JSON)
    ChatSession(FakeLink(), out, "s", events=True).send("hi")
    events = [json.loads(line) for line in o.getvalue().splitlines()]
    assert [ev["event"] for ev in events] == ["token", "token", "token", "done"]
    done = events[-1]
    assert done["text"] == "Hello!" and done["snapshot_id"] == "ab" * 16 and done["finish_reason"] == "stop"
    assert {"ttft_ms", "tokens_per_s", "prompt_tokens", "completion_tokens", "resumed", "tier"} <= set(done)
    assert e.getvalue() == ""


def test_ctrl_c_during_reply_closes_the_stream():
    out, o, e = outputs()
    link = FakeLink(interrupt_after=2)
    res = ChatSession(link, out, "s").send("hi")
    assert o.getvalue() == "Hello\n" and "reply stopped" in e.getvalue()
    assert res["interrupted"] is True and res["text"] == "Hello"
    assert link.closed == 1 and link.settled


def test_stats_after_ctrl_c_show_the_state_the_session_kept():
    """Stopping a reply disconnects, so its last chunk (snapshot id, token counts) never arrives: /stats
    must show the snapshot the daemon took of the partial reply, not the state before the reply."""
    partial = {"id": "ef" * 16, "n_tokens": 12, "nbytes": 3072}

    class Recorded(FakeLink):
        def stream(self, session, messages, sampling):
            yield {"type": "start", "engram": {"session": session, "prompt_tokens": 10, "snapshot_id": None}}
            yield {"type": "token", "text": "Hel"}
            raise KeyboardInterrupt

        def head(self, session):
            return partial if getattr(self, "settled", False) else None  # recorded once the turn has settled

        def snapshot(self, sid):
            return partial if sid == partial["id"] else super().snapshot(sid)

    code, o, e, link, chat = run_repl("hi\n/stats\n", Recorded())
    assert code == 0 and "reply stopped" in e
    assert "tokens in state  12" in e and "snapshot         efefefefefef  3.0 KiB" in e
    assert chat.last["completion_tokens"] == 2 and chat.last["finish_reason"] == "cancelled"


def test_a_reply_the_daemon_cut_short_is_an_error_not_a_finish():
    """`daemon stop` mid-reply: the wire's finish_reason says "length" (OpenAI's has no "cancelled"); the
    daemon's own word says "cancelled". The NDJSON done event carries it and the command fails."""

    class Stopped(FakeLink):
        def stream(self, session, messages, sampling):
            yield {"type": "start", "engram": {"session": session, "prompt_tokens": 10}}
            yield {"type": "token", "text": "The"}
            yield {
                "type": "done",
                "finish_reason": "length",
                "usage": {"prompt_tokens": 10, "completion_tokens": 1},
                "engram": {"snapshot_id": "ab" * 16, "finish_reason": "cancelled"},
            }

    out, o, e = outputs(JSON)
    with pytest.raises(EngramError, match="ended this reply before it finished") as err:
        ChatSession(Stopped(), out, "s", events=True).send("hi")
    assert err.value.exit_code == 1 and err.value.hint == "engramctl chat --session s"
    done = [json.loads(line) for line in o.getvalue().splitlines()][-1]
    assert done["event"] == "done" and done["finish_reason"] == "cancelled" and done["text"] == "The"


@pytest.mark.parametrize(
    "ext,text",
    [
        (None, "new session"),
        ({"restored_tokens": 412, "tier": "ram", "restore_ms": 13.6}, "resumed: 412 tokens restored from ram in 14 ms"),
        (
            {"tokens": 9, "tier": "live", "restore_ms": 0.0},
            "resumed: 9 tokens restored from memory (already loaded) in 0 ms",
        ),
        ({"tokens": 0, "n_messages": 4}, "resumed from the transcript (4 messages, state rebuilt on the first turn)"),
    ],
)
def test_describe_origin(ext, text):
    assert describe_origin(ext) == text


def run_repl(script: str, link=None):
    out, o, e = outputs()
    link = link or FakeLink()
    chat = ChatSession(link, out, "s")
    reader = repl_mod.LineReader(out, stream=io.StringIO(script))
    code = repl_mod.Repl(chat, out, reader).run()
    return code, o.getvalue(), e.getvalue(), link, chat


def test_help_is_generated_from_the_table():
    text = repl_mod.help_text()
    for c in repl_mod.COMMANDS:
        assert c.name in text and c.help in text
    assert {c.name for c in repl_mod.COMMANDS} == {"/?", "/bye", "/save", "/branch", "/history", "/stats", "/clear"}


def test_repl_dispatch():
    script = (
        "hi\n/save my label\n/branch idea\n/history\n/stats\n/clear\n/nope\n/?\n"
        '"""\nline 1\n\nline 3\n"""\n/bye\nnot sent\n'
    )
    code, o, e, link, chat = run_repl(script)
    assert code == 0
    assert link.saved == [("s", "my label")] and "Saved snapshot cdcdcdcdcdcd as 'my label'" in e
    assert chat.session == "idea" and "now in 'idea'" in e
    assert "user: hi\nassistant: Hello!" in e
    assert "tokens in state  13" in e and "2.0 KiB" in e
    assert (
        "Cleared: the next message starts 'idea' from an empty state; its 2 earlier snapshot(s) are kept "
        "(engramctl snapshots ls --session idea)." in e
    )
    assert "Error: unknown command '/nope'." in e and "Hint: /? lists the commands" in e
    assert "Commands:" in e
    assert link.sent[-1] == [{"role": "user", "content": "line 1\n\nline 3"}]
    assert all(m[-1]["content"] != "not sent" for m in link.sent)
    assert o.count("Hello!") == 2


def test_repl_eof_exits_and_errors_do_not():
    code, o, e, link, chat = run_repl("/branch\n/branch s\nhello\n")
    assert code == 0 and "/branch needs a name" in e
    assert "Error: exists" in e  # an error from the daemon is shown; the REPL goes on
    assert link.sent == [[{"role": "user", "content": "hello"}]]


def test_one_line_fence():
    code, o, e, link, chat = run_repl('"""just one"""\n')
    assert link.sent == [[{"role": "user", "content": "just one"}]]


def test_autostart_prints_the_daemons_notices_once(monkeypatch, engram_home):
    """The fallback-model line is worded once, by the daemon (daemon/model.py load_model -> /v1/status
    notices); the CLI prints what the daemon it started reports."""
    from engramctl.cli import chatlink
    from engramctl.daemon import background
    from engramctl.settings import load_settings

    line = "the default model is not available offline; using the fallback."
    monkeypatch.setattr(background, "daemon_status", lambda settings: None)
    monkeypatch.setattr(
        background,
        "start_background",
        lambda settings, wait=True: {"ready": True, "model": "fallback", "notices": [line]},
    )
    out, o, e = outputs()
    link = chatlink.connect_chat(load_settings({"no_autostart": False}), out, requested_model=None)
    link.close()
    assert e.getvalue().count(line) == 1 and o.getvalue() == "" and link.model_id == "fallback"
