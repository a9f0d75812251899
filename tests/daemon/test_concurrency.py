"""Concurrent sessions (issue 12, item 4): 8 clients on 8 sessions at once against one daemon process
(tiny model, transformers backend), streamed and plain, with a client that disconnects mid-stream and one
that cancels: every greedy reply equals the same conversation run alone, no session sees another's
state, each session stays resumable, a full queue answers 429 with Retry-After, and nothing hangs
(every request has a timeout; the whole run must end)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.daemon import harness

CLIENTS = 8
TURNS = 2


@pytest.fixture(scope="module")
def daemon(model_dir, tmp_path_factory):
    d = harness.start(model_dir, tmp_path_factory.mktemp("concurrency"), "--max-queue", "16")
    yield d
    d.stop()


def conversation(h: httpx.Client, session: str, k: int) -> list[str]:
    """Client k's conversation: its own questions; odd clients stream."""
    replies = []
    for t in range(TURNS):
        question = f"Client {k} asks question {t} about topic {k * 7 + t}."
        if k % 2:
            text, engram, _ = harness.stream_chat(h, session, question, 6 + k % 3)
            assert engram["session"] == session
        else:
            r = harness.chat(h, session, [{"role": "user", "content": question}], max_tokens=6 + k % 3)
            assert r["engram"]["session"] == session
            text = r["choices"][0]["message"]["content"]
        replies.append(text)
    return replies


def run_all(fns) -> list:
    out, errors = [None] * len(fns), []

    def go(i, fn):
        try:
            out[i] = fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a client is still waiting after 120 s: deadlock?"
    assert not errors, errors
    return out


def disconnect_mid_stream(d: harness.Proc, session: str) -> None:
    """Open a long stream, read its first pieces, then drop the connection."""
    body = {
        "model": "default",
        "session": session,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
    }
    with d.http(timeout=60) as h, h.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        pieces = 0
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                pieces += 1
            if pieces >= 3:
                break  # leaving the with-block closes the connection mid-stream


def test_eight_sessions_at_once_answer_as_alone_and_stay_resumable(daemon):
    with daemon.http() as h:  # alone, one after another
        alone = [conversation(h, f"alone-{k}", k) for k in range(CLIENTS)]

    def client(k):
        with daemon.http(timeout=120) as h:
            return conversation(h, f"together-{k}", k)

    fns = [lambda k=k: client(k) for k in range(CLIENTS)]
    fns += [lambda: disconnect_mid_stream(daemon, "dropped-a"), lambda: disconnect_mid_stream(daemon, "dropped-b")]
    together = run_all(fns)[:CLIENTS]
    assert together == alone

    with daemon.http() as h:
        for k in range(CLIENTS):  # no session saw another's state: the transcripts are their own
            messages = harness.transcript(h, f"together-{k}")
            assert [m["content"] for m in messages if m["role"] == "user"] == [
                f"Client {k} asks question {t} about topic {k * 7 + t}." for t in range(TURNS)
            ]
            assert [m["content"] for m in messages if m["role"] == "assistant"] == alone[k]
        # every session resumes: one more turn each, from its own snapshot, equal to the alone run's
        for k in range(CLIENTS):
            a = harness.chat(h, f"alone-{k}", [{"role": "user", "content": "And then?"}])
            b = harness.chat(h, f"together-{k}", [{"role": "user", "content": "And then?"}])
            assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
            assert b["engram"]["restored_tokens"] > 0
        for name in ("dropped-a", "dropped-b"):  # cut short, recorded as such, and resumable
            messages = harness.transcript(h, name)
            assert messages[-1]["role"] == "assistant" and messages[-1].get("finish_reason") == "cancelled"
            r = harness.chat(h, name, [{"role": "user", "content": "Go on."}])
            assert r["choices"][0]["finish_reason"] in ("stop", "length")
        # nothing left waiting or stuck: the worker frees itself just after the last answer has gone out
        deadline = time.monotonic() + 10
        while (queue := h.get("/v1/status").json()["queue"])["busy"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queue["waiting"] == 0 and not queue["busy"]


def test_a_full_queue_answers_429_with_retry_after(model_dir, tmp_path):
    d = harness.start(model_dir, tmp_path / "home", "--max-queue", "1")
    try:
        codes: list[tuple[int, str | None, dict]] = []
        lock = threading.Lock()

        def one(k):
            with d.http(timeout=120) as h:
                r = h.post(
                    "/v1/chat/completions",
                    json={
                        "model": "default",
                        "session": f"q{k}",
                        "messages": [{"role": "user", "content": f"Question {k}, long answer please."}],
                        "max_tokens": 60,
                        "temperature": 0,
                    },
                )
                with lock:
                    codes.append((r.status_code, r.headers.get("retry-after"), json.loads(r.content)))

        run_all([lambda k=k: one(k) for k in range(8)])
        refused = [c for c in codes if c[0] == 429]
        assert refused and len(refused) < 8, [c[0] for c in codes]
        assert all(retry == "1" and body["error"]["code"] for _, retry, body in refused)
        assert all(c[0] == 200 for c in codes if c[0] != 429)
        with d.http() as h:  # the refused sessions were never created; a retry is served
            assert harness.chat(h, "q-retry", [{"role": "user", "content": "hi"}])["choices"]
    finally:
        d.stop()
    assert "Traceback" not in d.log_text()
