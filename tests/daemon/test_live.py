"""Against a real daemon process: the official openai client, sessions across turns, every snapshot
route, disconnect cancels and records the partial reply, 429 when the queue is full, SIGTERM."""

from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.backends import both_backends, served_id
from tests.daemon.conftest import greedy_reference, start_daemon
from tests.helpers import chat

LONG = 3000  # max_tokens of generations the tests cut short (greedy on this model does not stop by itself)

pytestmark = both_backends  # nothing here depends on the backend: every test runs on both


@pytest.fixture(scope="module")
def daemon(backend, served, tmp_path_factory):
    # one turn at a time: a second request queues (the 429 test), one state is kept hot (the reset tests);
    # tests/daemon/test_scheduler.py covers turns served together
    d = start_daemon(
        served, tmp_path_factory.mktemp("live-home"), "--max-queue", "1", "--backend", backend, "--serial-turns"
    )
    yield d
    d.stop()


@pytest.fixture
def oai(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key=daemon.token, max_retries=0, timeout=60)


def _wait(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_openai_client_streaming_and_not(daemon, oai, reference_backend, backend, served):
    assert [m.id for m in oai.models.list().data] == [served_id(backend, served)]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is a state space model?"}]
    r = oai.chat.completions.create(model="default", messages=messages, max_tokens=8, temperature=0)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens > 0
    assert text == greedy_reference(reference_backend, messages, 8)
    extra = r.model_extra["engram"]
    assert extra["session"].startswith("auto-") and extra["snapshot_id"]

    stream = oai.chat.completions.create(
        model="default",
        messages=messages,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    # the same prompt again: the prompt snapshot covers all of it
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens
    assert chunks[0].model_extra["engram"]["resumed"] is True
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=daemon.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_any_model_name_is_the_served_model(daemon, oai, backend, served):
    """The original Engram server's README example names "granite-4.0-h-tiny": with one model served,
    any name is that model (as llama-server does), and the answer reports the served model's name."""
    served = served_id(backend, served)
    messages = [{"role": "user", "content": "Hello there"}]
    r = oai.chat.completions.create(
        model="granite-4.0-h-tiny", messages=messages, max_tokens=3, temperature=0, extra_body={"session": "any-model"}
    )
    assert r.model == served and r.usage.completion_tokens > 0
    stream = oai.chat.completions.create(
        model="no-such-model", messages=messages, max_tokens=3, temperature=0, stream=True
    )
    assert {c.model for c in stream} == {served}
    with daemon.http() as h:
        cont = h.post(
            "/restore_snapshot",
            json={
                "model": "granite-4.0-h-tiny",
                "conversation_id": "any-model",
                "continuation": "And then?",
                "max_tokens": 2,
            },
        )
        assert cont.status_code == 200, cont.text
        assert cont.json()["model"] == served and cont.json()["engram"]["restored_tokens"] > 0


def test_session_turns_continue_from_the_daemons_own_state(daemon, oai):
    def turn(content, **kw):
        r = oai.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": content}],
            max_tokens=6,
            temperature=0,
            extra_body={"session": "notes"},
            **kw,
        )
        return r, r.model_extra["engram"]

    r1, e1 = turn("First question?")
    assert e1["session"] == "notes" and not e1["resumed"] and e1["computed_tokens"] == r1.usage.prompt_tokens
    r2, e2 = turn("Second question?")
    total1 = r1.usage.prompt_tokens + r1.usage.completion_tokens
    assert e2["resumed"] and e2["tier"] == "live" and e2["restored_tokens"] == total1
    assert r2.usage.prompt_tokens_details.cached_tokens == total1
    assert e2["computed_tokens"] == r2.usage.prompt_tokens - total1
    with daemon.http() as h:
        s = h.get("/v1/sessions/notes").json()
        assert [m["role"] for m in s["messages"]] == ["user", "assistant", "user", "assistant"]
        assert s["messages"][1]["content"] == r1.choices[0].message.content
        assert s["head"] == e2["snapshot_id"]
        head = h.post("/get_snapshot_info", json={"session": "notes"}).json()
        assert head["tokens"] == r2.usage.prompt_tokens + r2.usage.completion_tokens and head["n_messages"] == 4
        # a client resending the whole history with the session: only the new message is a new turn
        history = s["messages"] + [{"role": "user", "content": "Third?"}]
        r3 = h.post(
            "/v1/chat/completions",
            json={"model": "default", "session": "notes", "messages": history, "max_tokens": 3, "temperature": 0},
        ).json()
        assert r3["engram"]["restored_tokens"] == head["tokens"]
        assert len(h.get("/v1/sessions/notes").json()["messages"]) == 6
        sessions = {x["name"]: x for x in h.get("/v1/sessions").json()["sessions"]}
        assert sessions["notes"]["hot"] and sessions["notes"]["n_messages"] == 6
        # its head's tokens and tiers come with it (`engramctl sessions` lists no snapshot for them): in memory first
        now = h.post("/get_snapshot_info", json={"session": "notes"}).json()
        assert sessions["notes"]["head_tokens"] == now["tokens"] > head["tokens"]
        assert sessions["notes"]["head_tiers"][0] in ("vram", "ram"), sessions["notes"]


def test_snapshot_routes(daemon):
    with daemon.http() as h:
        r = h.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "session": "snap",
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        )
        assert r.status_code == 200, r.text
        head = r.json()["engram"]["snapshot_id"]

        saved = h.post("/save_snapshot", json={"conversation_id": "snap", "label": "after hi"}).json()
        assert saved["success"] and saved["snapshot_id"] == head and saved["pinned"] and saved["label"] == "after hi"

        listed = h.post("/list_snapshots", json={"session": "snap"}).json()["snapshots"]
        assert [s["snapshot_id"] for s in listed][-1] == head and len(listed) == 2  # prompt + reply
        for s in listed:
            assert {"snapshot_id", "session", "tokens", "bytes", "tier", "created", "pinned", "parent"} <= set(s)
        assert listed[-1]["parent"] == listed[0]["snapshot_id"]
        all_ids = {s["snapshot_id"] for s in h.get("/list_snapshots").json()["snapshots"]}
        assert {s["snapshot_id"] for s in listed} <= all_ids

        info = h.post("/get_snapshot_info", json={"snapshot_id": head[:24]}).json()
        assert "snapshot_id" in info, info
        assert info["snapshot_id"] == head and info["session"] == "snap"

        # another turn, then restore the saved one with a continuation: the new turn follows the saved state
        h.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "session": "snap",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": "More"}],
            },
        )
        restored = h.post("/restore_snapshot", json={"snapshot_id": head}).json()
        assert restored["success"] and restored["session"] == "snap" and restored["tokens"] == saved["tokens"]
        assert restored["tier"] in ("ram", "disk", "vram", "live") and restored["restore_ms"] is not None
        assert len(h.get("/v1/sessions/snap").json()["messages"]) == 2  # the transcript went back too
        cont = h.post(
            "/restore_snapshot", json={"session": "snap", "continuation": "Go on", "max_tokens": 3, "temperature": 0}
        ).json()
        assert cont["object"] == "chat.completion" and cont["engram"]["restored_tokens"] == saved["tokens"]
        assert cont["engram"]["tier"] == "live"
        with h.stream(
            "POST",
            "/restore_snapshot",
            json={
                "snapshot_id": head,
                "session": "snap-2",
                "stream": True,
                "continuation": {"role": "user", "content": "Other way"},
                "max_tokens": 3,
            },
        ) as s:
            assert s.status_code == 200
            events = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
        assert events[0]["engram"]["session"] == "snap-2" and events[0]["engram"]["restored_tokens"] == saved["tokens"]
        snap2 = h.get("/v1/sessions/snap-2").json()
        assert snap2["base"] == head and len(snap2["messages"]) == 4

        branched = h.post("/branch_snapshot", json={"source": "snap", "new_session": "snap-b"}).json()
        assert (
            branched["success"] and branched["name"] == "snap-b" and branched["head"] == cont["engram"]["snapshot_id"]
        )
        by_id = h.post("/branch_snapshot", json={"snapshot_id": head[:24], "new_session": "snap-c"}).json()
        assert by_id["head"] == head

        r = h.post("/delete_snapshot", json={"snapshot_id": head})
        assert r.status_code == 409 and r.json()["error"]["code"] == "snapshot_in_use"
        victim = listed[0]["snapshot_id"]  # the prompt snapshot: nobody's head
        assert h.post("/delete_snapshot", json={"snapshot_id": victim}).json() == {
            "success": True,
            "snapshot_id": victim,
        }
        assert h.post("/get_snapshot_info", json={"snapshot_id": victim}).status_code == 404
        r = h.post("/delete_snapshot", json={"snapshot_id": head, "force": True})
        assert r.status_code == 200
        tiers = h.get("/v1/tiers").json()
        assert {t["name"] for t in tiers["tiers"]} == {"vram", "ram", "disk"}


def test_pin_label_unpin_transcript_and_gc_of_any_snapshot(daemon):
    with daemon.http() as h:
        first = chat(h, "mgmt", "Hi")
        prompt = h.post("/list_snapshots", json={"session": "mgmt"}).json()["snapshots"][0]["snapshot_id"]
        p = h.post("/pin_snapshot", json={"snapshot_id": prompt[:24], "label": "kept"}).json()
        assert p["success"] and p["snapshot_id"] == prompt and p["pinned"] and p["label"] == "kept"
        assert h.post("/label_snapshot", json={"snapshot_id": prompt[:24], "label": None}).json()["label"] is None
        second = chat(h, "mgmt", "More")
        # the snapshot's own transcript, even after its session went another way
        assert h.post("/restore_snapshot", json={"snapshot_id": first["engram"]["snapshot_id"]}).json()["success"]
        chat(h, "mgmt", "Other way")
        t = h.post("/get_snapshot_transcript", json={"snapshot_id": second["engram"]["snapshot_id"]}).json()
        assert [m["content"] for m in t["messages"] if m["role"] == "user"] == ["Hi", "More"] and t["n_messages"] == 4
        for i in range(2):  # 10 snapshots: keep-last-8 passes over the pinned one after each write
            chat(h, "mgmt", f"turn {i}", max_tokens=2)
        _wait(lambda: h.get("/v1/status").json()["pending_writes"] == 0, what="the writes (each applies keep-last)")
        ids = [s["snapshot_id"] for s in h.post("/list_snapshots", json={"session": "mgmt"}).json()["snapshots"]]
        assert ids[0] == prompt and len(ids) == 9
        nbytes = h.post("/unpin_snapshot", json={"snapshot_id": prompt}).json()["bytes"]
        gc = h.post("/gc_snapshots").json()
        assert gc["success"] and gc["deleted"] == {prompt: "keep_last"} and gc["freed_bytes"] == nbytes
        assert h.post("/get_snapshot_info", json={"snapshot_id": prompt}).status_code == 404


def test_import_through_the_daemon_is_verified_against_the_model(daemon):
    from engramctl.settings import load_settings
    from engramctl.store import exchange, snapshot_file
    from engramctl.store.files import SnapshotFiles
    from tests.cli.conftest import make_payload

    raw = {"Content-Type": "application/octet-stream"}
    with daemon.http() as h:
        sid = chat(h, "exp", "Hello")["engram"]["snapshot_id"]
        messages = h.post("/get_snapshot_transcript", json={"snapshot_id": sid}).json()["messages"]
        data_dir = load_settings({}, env={"ENGRAM_HOME": str(daemon.home)}).paths.data_dir
        tokens = h.post("/get_snapshot_info", json={"snapshot_id": sid}).json()["tokens"]
        _wait(lambda: h.post("/get_snapshot_info", json={"snapshot_id": sid}).json()["durable"], what="the file")
        own = exchange.pack(snapshot_file.read(SnapshotFiles(data_dir).path(sid)), messages, "exp")
        alien = exchange.pack(make_payload(8, fingerprint="another-model"), messages, "alien")
        sessions = {s["name"] for s in h.get("/v1/sessions").json()["sessions"]}
        r = h.post("/import_snapshot", content=alien, headers=raw)
        assert r.status_code == 409 and r.json()["error"]["code"] == "snapshot_mismatch", r.text
        assert {s["name"] for s in h.get("/v1/sessions").json()["sessions"]} == sessions  # nothing stored
        imp = h.post("/import_snapshot", params={"session": "exp-copy"}, content=own, headers=raw).json()
        assert imp["session"] == "exp-copy" and imp["tokens"] == tokens and imp["messages"] == 2
        assert chat(h, "exp-copy", "Go on")["engram"]["restored_tokens"] == tokens


def test_reset_session_starts_over_and_keeps_the_old_snapshots(daemon):
    with daemon.http() as h:
        first = chat(h, "clr", "Hello there")
        chat(h, "clr", "And more")
        old = [s["snapshot_id"] for s in h.post("/list_snapshots", json={"session": "clr"}).json()["snapshots"]]
        assert h.get("/v1/status").json()["hot"]["session"] == "clr"
        r = h.post("/v1/sessions/clr/reset").json()
        assert r["success"] and r["head"] is None and r["n_messages"] == 0 and r["previous_head"] == old[-1]
        assert r["n_snapshots"] == len(old) == 4
        assert h.get("/v1/status").json()["hot"] is None  # the hot state of the old conversation is gone
        again = chat(h, "clr", "Hello there")
        assert not again["engram"]["resumed"] and again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
        now = [s["snapshot_id"] for s in h.post("/list_snapshots", json={"session": "clr"}).json()["snapshots"]]
        assert now[:4] == old and len(now) == 6
        assert len(h.get("/v1/sessions/clr").json()["messages"]) == 2
        t = h.post("/get_snapshot_transcript", json={"snapshot_id": old[-1]}).json()
        assert [m["content"] for m in t["messages"] if m["role"] == "user"] == ["Hello there", "And more"]


def test_disconnect_mid_stream_cancels_and_records_the_partial_reply(daemon):
    body = {
        "model": "default",
        "session": "cut",
        "stream": True,
        "max_tokens": LONG,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    got = []
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=30) as h:
        with h.stream("POST", "/v1/chat/completions", json=body) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    got.append(json.loads(line[6:]))
                if len(got) >= 6:
                    break  # leaving the block closes the connection mid-stream
    prompt_tokens = got[0]["engram"]["prompt_tokens"]
    shown = "".join(c["choices"][0]["delta"].get("content") or "" for c in got)
    with daemon.http() as h:

        def recorded():  # the session exists once the cancelled turn is recorded
            msgs = h.get("/v1/sessions/cut").json().get("messages", [])
            return msgs if len(msgs) == 2 else None

        msgs = _wait(recorded, what="the partial reply in the transcript")
        assert msgs[1]["finish_reason"] == "cancelled" and msgs[1]["content"].startswith(shown)
        head = h.post("/get_snapshot_info", json={"session": "cut"}).json()
        assert prompt_tokens < head["tokens"] < prompt_tokens + 200  # cut long before max_tokens
        assert not h.get("/v1/status").json()["queue"]["busy"]
        nxt = chat(h, "cut", "Next", 2)
        # the state holds exactly what was consumed: the next turn continues from it
        assert nxt["engram"]["restored_tokens"] == head["tokens"] and nxt["engram"]["tier"] == "live"


def test_queue_full_gets_429(daemon):
    body = {
        "model": "default",
        "stream": True,
        "max_tokens": LONG,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    second_started = threading.Event()
    results: dict = {}

    def second():
        with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as h2:
            with h2.stream("POST", "/v1/chat/completions", json={**body, "session": "q2"}) as s:
                results["second"] = s.status_code
                second_started.set()

    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=60) as h:
        with h.stream("POST", "/v1/chat/completions", json={**body, "session": "q1"}) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            next(lines)  # generating now
            t = threading.Thread(target=second)
            t.start()
            _wait(lambda: h.get("/v1/status").json()["queue"]["waiting"] == 1, what="the second request to queue")
            r = h.post("/v1/chat/completions", json={**body, "stream": False})
            assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
            assert r.json()["error"]["type"] == "rate_limit_error"
        t.join(30)
    assert results["second"] == 200  # it ran once the first one was cancelled by its disconnect
    with daemon.http() as h:
        _wait(lambda: not h.get("/v1/status").json()["queue"]["busy"], what="the worker to go idle")


def test_disconnect_while_waiting_for_a_non_streamed_reply_cancels_it(daemon):
    body = {
        "model": "default",
        "session": "gone",
        "max_tokens": LONG,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    # the client gives up 0.2 s in, mid-reply: the tiny GGUF writes its whole reply (the context's room, ~2,070
    # tokens) in ~0.5 s, so a 0.5 s timeout raced the reply's end (a CI run saw it end at 0.48 s)
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=httpx.Timeout(10, read=0.2)) as h:
        with pytest.raises(httpx.ReadTimeout):
            h.post("/v1/chat/completions", json=body)
    with daemon.http() as h:

        def partial_reply():
            # the user's message is recorded with the prompt's snapshot, before any reply: wait for the reply's
            msgs = h.get("/v1/sessions/gone").json().get("messages") or []
            return msgs if msgs and msgs[-1]["role"] == "assistant" else None

        msgs = _wait(partial_reply, what="the partial reply")
        assert msgs[-1]["finish_reason"] == "cancelled"
        assert not h.get("/v1/status").json()["queue"]["busy"]


def test_sigterm_cancels_the_generation_flushes_and_exits(daemon):
    body = {
        "model": "default",
        "session": "term",
        "stream": True,
        "max_tokens": LONG,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Hello there"}],
    }
    pieces = []
    with httpx.Client(base_url=daemon.url, headers=daemon.headers, timeout=30) as h:
        with h.stream("POST", "/v1/chat/completions", json=body) as s:
            for line in s.iter_lines():
                if line.startswith("data: {"):
                    pieces.append(json.loads(line[6:]))
                    if len(pieces) == 3:
                        t0 = time.monotonic()
                        daemon.proc.send_signal(signal.SIGTERM)
            # the stream ends cleanly: a final chunk, then [DONE]
    assert pieces[-1]["engram"]["finish_reason"] == "cancelled" and pieces[-1]["engram"]["snapshot_id"]
    assert daemon.proc.wait(10) == 0 and time.monotonic() - t0 < 8
    assert "Traceback" not in daemon.log_text()
    assert not (daemon.home / "run" / "daemon.json").exists()
    # everything committed before exiting is on disk
    from engramctl.settings import load_settings
    from engramctl.store.store import Store

    with Store.open(load_settings({}, env={"ENGRAM_HOME": str(daemon.home)})) as store:
        head = store.sessions.get("term").head
        assert head == pieces[-1]["engram"]["snapshot_id"] and store.snapshots.info(head).durable
        assert store.transcripts.of_session("term")[-1]["finish_reason"] == "cancelled"
