"""The original Engram server's three end-to-end scenarios (its Phase 7, 8 and 10 tests), written as a
client of that server would, against a real daemon process serving a tiny model:

1. save after turn 1, generate turn 2, restore turn 1, regenerate turn 2 greedily: the same text;
2. restore-and-generate with only the new turn's tokens answers what a full resend of the conversation
   answers, and sends fewer tokens;
3. snapshots survive SIGKILL; after a restart a restore by conversation id succeeds and generation from
   the saved turn gives what it gave before the kill."""

from __future__ import annotations

import signal

from tests.backends import both_backends
from tests.daemon.conftest import start_daemon
from tests.daemon.test_engram_api import chat, generate_from, post, user_turn_ids
from tests.helpers import module_daemon

pytestmark = both_backends  # the Engram routes sit above the engine: the same on either backend


daemon = module_daemon("engram-scenarios")


def test_restore_turn_1_then_regenerating_turn_2_gives_the_same_text(daemon):
    with daemon.http() as h:
        messages = [{"role": "user", "content": "My secret word is: ALPHA42."}]
        t1 = chat(h, "phase7", messages[0]["content"], max_tokens=8)
        messages.append({"role": "assistant", "content": t1["choices"][0]["message"]["content"]})
        saved = post(h, "/save_snapshot", {"conversation_id": "phase7", "turn_number": 1})
        assert saved["snapshot_id"] == "phase7-t1"

        # turn 2, the whole history resent as their test does (the conversation's own state is used)
        with_t2 = messages + [{"role": "user", "content": "What is my secret word?"}]
        body = {"model": "default", "conversation_id": "phase7", "messages": with_t2, "max_tokens": 8, "temperature": 0}
        original = h.post("/v1/chat/completions", json=body).json()
        assert original["engram"]["restored_tokens"] == t1["usage"]["total_tokens"]

        restored = post(h, "/restore_snapshot", {"conversation_id": "phase7", "turn_number": 1})
        assert restored["snapshot_id"] == saved["id"] and restored["token_count"] == t1["usage"]["total_tokens"]

        again = h.post("/v1/chat/completions", json=body).json()
        assert again["choices"][0]["message"]["content"] == original["choices"][0]["message"]["content"]
        assert again["engram"]["restored_tokens"] == t1["usage"]["total_tokens"]  # from turn 1, not from turn 2
        turns = post(h, "/list_snapshots", {"conversation_id": "phase7"})["snapshots"]
        assert [s["turn_number"] for s in turns] == [1, 2] and turns[1]["id"] == again["engram"]["snapshot_id"]


def test_restore_and_generate_with_only_the_new_tokens_answers_as_a_full_resend(daemon, reference_backend):
    tok = reference_backend.tokenizer
    with daemon.http() as h:
        chat(h, "phase8", "My favorite color is blue.", max_tokens=8)
        snap = post(h, "/save_snapshot", {"conversation_id": "phase8"})  # their minimal save
        assert snap["snapshot_id"] == "phase8-t1"
        history = post(h, "/get_snapshot_info", {"snapshot_id": snap["snapshot_id"]})["metadata"]["fill_ids"]

        ids = user_turn_ids(tok, "What is my favorite color?")  # only the new turn
        stateful = post(
            h,
            "/restore_snapshot",
            {"conversation_id": "phase8", "create_new_request": True, "continuation_ids": ids, "max_new_tokens": 10},
        )
        # a full resend: a server without state reads the whole conversation's tokens, then answers
        full = history + ids
        assert (stateful["output_ids"], stateful["output_text"]) == generate_from(
            reference_backend, full, temperature=0, max_tokens=10
        )
        assert len(ids) < len(full) and stateful["usage"]["prompt_tokens_details"]["cached_tokens"] == len(history)

        # a 3-turn chain (their test_multi_turn_stateful_chain): save, then continue from the latest turn
        assert post(h, "/save_snapshot", {"conversation_id": "phase8"})["snapshot_id"] == "phase8-t2"
        chain = post(h, "/get_snapshot_info", {"snapshot_id": "phase8-t2"})["metadata"]["fill_ids"]
        more = user_turn_ids(tok, "And my lucky number?")
        third = post(
            h,
            "/restore_snapshot",
            {"conversation_id": "phase8", "create_new_request": True, "continuation_ids": more, "max_new_tokens": 10},
        )
        assert third["turn_number"] == 3 and third["token_count"] == len(chain)
        assert (third["output_ids"], third["output_text"]) == generate_from(
            reference_backend, chain + more, temperature=0, max_tokens=10
        )


def test_snapshots_survive_sigkill_and_restore_by_conversation_id(served, tmp_path, reference_backend):
    tok = reference_backend.tokenizer
    home = tmp_path / "killed-home"
    ids = user_turn_ids(tok, "Still there?")
    gen = {
        "conversation_id": "phase10",
        "turn_number": 1,
        "create_new_request": True,
        "continuation_ids": ids,
        "max_new_tokens": 6,
    }
    d = start_daemon(served, home)
    try:
        with d.http() as h:
            chat(h, "phase10", "Describe the solar system.", max_tokens=8)
            saved = post(h, "/save_snapshot", {"conversation_id": "phase10", "turn_number": 1})
            assert saved["durable"]  # answered once it is on disk
            conversation = saved["snapshot_id"].rsplit("-t", 1)[0]  # as their resilience script recovers it
            assert conversation == "phase10"
            before = post(h, "/restore_snapshot", gen)
            chat(h, "phase10", "One more turn, maybe not on disk yet.", max_tokens=8)
        assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    finally:
        d.stop()
    d = start_daemon(served, home)
    try:
        with d.http() as h:
            listed = post(h, "/list_snapshots", {"conversation_id": conversation})["snapshots"]
            assert saved["id"] in [s["id"] for s in listed if s["turn_number"] == 1]
            restored = post(h, "/restore_snapshot", {"conversation_id": conversation})
            assert restored["snapshot_id"] and restored["token_count"] > 0
            after = post(h, "/restore_snapshot", gen)
            assert (after["output_ids"], after["output_text"]) == (before["output_ids"], before["output_text"])
            assert after["engram"]["restored_tokens"] == after["token_count"] == saved["tokens"]
    finally:
        d.stop()
    assert "Traceback" not in d.log_text()
