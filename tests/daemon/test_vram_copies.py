"""The daemon over llama.cpp's VRAM tier (engine/llama_device_copies.py), on the CPU build where the same calls
copy within host memory: conversations beyond those running stay hot (as many more as the backend has slots for),
each parked with a device copy of its state, their next turns resume from it (`tier: vram`, the copy's load as
`restore_ms`), and every reply is the one a daemon without copies gives; /v1/tiers says so."""

from __future__ import annotations

import pytest

from engramctl.engine.engine import Engine
from engramctl.engine.llama_backend import LlamaCppBackend
from tests.helpers import chat, served_app

TURNS = [("a", "Hello there"), ("b", "What is a cat?"), ("c", "Count to three"), ("a", "Tell me more")]
TURNS += [("b", "And a dog?"), ("c", "Now backwards"), ("a", "Why?")]


def _engine(path, copies_bytes: int | None) -> Engine:
    backend = LlamaCppBackend(path, path.name, chunk_tokens=32, sequences=1, copies_bytes=copies_bytes)
    return Engine(backend, backend.tokenizer)


def _replies(engine: Engine, home, monkeypatch) -> list[dict]:
    monkeypatch.setenv("ENGRAM_HOME", str(home))  # a store of its own
    with served_app(engine, serial_turns=True) as client:
        out = [chat(client, session, text, max_tokens=6) for session, text in TURNS]
        out.append(client.get("/v1/tiers").json()["device_copies"])
    return out


@pytest.fixture(scope="module")
def path(served_model):
    return served_model("llama.cpp")


def test_parked_conversations_resume_from_their_copies_with_the_replies_of_a_daemon_without(
    path, engram_home, monkeypatch
):
    engine = _engine(path, 64 << 20)
    assert engine.device_slots >= 2
    *got, copies = _replies(engine, engram_home / "copies", monkeypatch)
    *want, off = _replies(_engine(path, None), engram_home / "none", monkeypatch)
    assert [r["choices"][0]["message"]["content"] for r in got] == [r["choices"][0]["message"]["content"] for r in want]
    # one conversation runs at a time; the other two stay hot, parked with copies: each resumes from VRAM, and the
    # copy's load (inside its first step) is its restore_ms
    assert [r["engram"]["tier"] for r in got[3:]] == ["vram"] * 4
    assert all(r["engram"]["restore_ms"] > 0 and r["engram"]["resumed"] for r in got[3:])
    assert [r["engram"]["tier"] for r in want[3:]] == ["ram"] * 4  # keep 1: the others restore from the store
    assert copies["restores"] >= 4 and copies["held"] >= 1 and copies["slots"] == engine.device_slots
    assert 0 < copies["used_bytes"] <= copies["budget_bytes"]
    assert "as the backend was asked" in copies["rule"]
    assert off == {"slots": 0, "rule": "off: no layer is on a GPU"}
