"""The original Engram server's snapshot contract (../shared/reference/engram-http-contract.md,
docs/engram-api.md), one test per behaviour, over HTTP against a real daemon process serving a tiny model,
with our bearer token. Their three end-to-end scenarios are in test_engram_scenarios.py."""

from __future__ import annotations

import httpx
import pytest

from tests import helpers
from tests.backends import both_backends

ROUTES = ("/save_snapshot", "/list_snapshots", "/get_snapshot_info", "/restore_snapshot", "/delete_snapshot")
THEIR_ITEM = {"conversation_id", "turn_number", "branch_name", "timestamp", "token_count", "model_name"}

pytestmark = both_backends  # the Engram routes sit above the engine: the same on either backend


daemon = helpers.module_daemon("engram-home")


@pytest.fixture
def h(daemon):
    with daemon.http() as client:
        yield client


@pytest.fixture(scope="module")
def tok(reference_backend):
    return reference_backend.tokenizer


def chat(h, conversation: str, content: str, max_tokens: int = 4, **extra) -> dict:
    """A turn named the Engram way (conversation_id)."""
    return helpers.chat(h, None, content, max_tokens, conversation_id=conversation, **extra)


def post(h, path: str, body: dict, status: int = 200) -> dict:
    r = h.post(path, json=body)
    assert r.status_code == status, (path, body, r.status_code, r.text)
    body = r.json()
    assert body["success"] is (status == 200), body
    if status != 200:  # their failure shape beside ours
        assert body["message"] == body["error"]["message"] and body["message"], body
    return body


def user_turn_ids(tok, content: str) -> list[int]:
    """What the Engram server's clients send as continuation_ids: the chat template's render of the new
    user message alone, with the generation prompt (their test_mamba_stateful_inference.py)."""
    return tok.encode(tok.render([{"role": "user", "content": content}], add_generation_prompt=True))


def generate_from(backend, ids: list[int], **params) -> tuple[list[int], str]:
    """A stateless server's answer: a fresh state, every token prefilled, then the engine's generation."""
    from engramctl.engine.engine import Engine
    from engramctl.engine.sampling import SamplingParams

    engine = Engine(backend, backend.tokenizer)
    live = backend.new_live()
    backend.prefill(live, ids)
    gen = engine.generate(live, SamplingParams(**params))
    text = "".join(gen)
    out = list(gen.finish.token_ids)
    if gen.finish.reason == "stop" and out and out[-1] in backend.tokenizer.eos_ids:
        out = out[:-1]
    return out, text


def test_the_five_routes_need_our_token_and_fail_in_both_vocabularies(daemon):
    for path in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(daemon.url + path, json={"conversation_id": "c", "turn_number": 1}, headers=headers)
            body = r.json()
            assert r.status_code == 401 and body["success"] is False, (path, body)
            assert body["message"] == body["error"]["message"] and body["error"]["type"] == "authentication_error"


def test_turn_numbers_count_user_turns_from_one(h):
    first, second = chat(h, "turns", "First question?"), chat(h, "turns", "Second question?")
    listed = post(h, "/list_snapshots", {"conversation_id": "turns"})["snapshots"]
    # the prompt snapshots in the middle of each turn are ours alone: their list has the turns
    assert [s["turn_number"] for s in listed] == [1, 2]
    assert [s["id"] for s in listed] == [first["engram"]["snapshot_id"], second["engram"]["snapshot_id"]]
    assert [s["name"] for s in listed] == ["turns-t1", "turns-t2"] and all(s["branch_name"] is None for s in listed)
    for s, r in zip(listed, (first, second)):
        assert THEIR_ITEM <= set(s) and s["conversation_id"] == "turns" and s["timestamp"] == s["created"]
        assert s["token_count"] == r["usage"]["total_tokens"] and s["model_name"] == s["model_id"]
    ours = post(h, "/list_snapshots", {"session": "turns"})["snapshots"]  # our view: every snapshot, oldest first
    assert len(ours) == 4 and [s["turn_number"] for s in ours] == [None, 1, None, 2]


def test_save_with_turn_number_answers_their_id_which_then_names_the_snapshot(h):
    head = chat(h, "saving", "Hello there")["engram"]["snapshot_id"]
    saved = post(h, "/save_snapshot", {"conversation_id": "saving", "turn_number": 5})
    assert saved["snapshot_id"] == "saving-t5" and saved["id"] == head and saved["message"]
    assert saved["pinned"] and saved["durable"] and saved["turn_number"] == 5  # saved = pinned and on disk
    # their id works wherever a snapshot is referred to: their routes and ours
    assert post(h, "/get_snapshot_info", {"snapshot_id": "saving-t5"})["id"] == head
    assert post(h, "/get_snapshot_info", {"conversation_id": "saving", "turn_number": 5})["id"] == head
    assert post(h, "/label_snapshot", {"snapshot_id": "saving-t5", "label": "five"})["snapshot_id"] == head
    assert h.post("/get_snapshot_transcript", json={"snapshot_id": "saving-t5"}).json()["n_messages"] == 2
    # saving turn 5 again names the new state; the old snapshot keeps its own (unique) id
    newer = chat(h, "saving", "More")["engram"]["snapshot_id"]
    again = post(h, "/save_snapshot", {"conversation_id": "saving", "turn_number": 5})
    assert again["snapshot_id"] == "saving-t5" and again["id"] == newer != head
    assert post(h, "/get_snapshot_info", {"snapshot_id": head})["id"] == head
    listed = post(h, "/list_snapshots", {"conversation_id": "saving"})["snapshots"]
    assert [(s["turn_number"], s["id"]) for s in listed] == [(1, head), (2, newer), (5, newer)]


def test_save_with_a_custom_snapshot_id(h):
    head = chat(h, "custom", "Hello there")["engram"]["snapshot_id"]
    saved = post(h, "/save_snapshot", {"conversation_id": "custom", "snapshot_id": "my.ckpt-1"})
    assert saved["snapshot_id"] == "my.ckpt-1" and saved["id"] == head and saved["name"] == "my.ckpt-1"
    assert post(h, "/get_snapshot_info", {"snapshot_id": "my.ckpt-1"})["id"] == head
    assert post(h, "/restore_snapshot", {"snapshot_id": "my.ckpt-1"})["snapshot_id"] == head
    assert h.post("/branch_snapshot", json={"source": "my.ckpt-1", "new_session": "custom-b"}).json()["head"] == head
    listed = post(h, "/list_snapshots", {"conversation_id": "custom"})["snapshots"]
    assert [(s["turn_number"], s["name"]) for s in listed] == [(1, "my.ckpt-1")]
    for bad in ("a/b", "x" * 256, "0" * 32):  # their alphabet, up to 255 characters, never one of our ids
        post(h, "/save_snapshot", {"conversation_id": "custom", "snapshot_id": bad}, 400)
    # deleting it by that name (a head and a branch point: forced); the name goes with the snapshot
    post(h, "/delete_snapshot", {"snapshot_id": "my.ckpt-1"}, 409)
    post(h, "/delete_snapshot", {"snapshot_id": "my.ckpt-1", "force": True})
    post(h, "/get_snapshot_info", {"snapshot_id": "my.ckpt-1"}, 400)


def test_save_in_their_clients_shape_with_explicit_nulls(h):
    chat(h, "nulls", "Hello there")
    head = chat(h, "nulls", "More")["engram"]["snapshot_id"]
    saved = post(
        h,
        "/save_snapshot",
        {"rid": None, "snapshot_id": None, "conversation_id": "nulls", "turn_number": None, "branch_name": None},
    )
    assert saved["snapshot_id"] == "nulls-t2" and saved["id"] == head  # the turn the state is at
    bare = post(h, "/save_snapshot", {"conversation_id": "nulls"})  # their minimal request
    assert bare["snapshot_id"] == "nulls-t2"
    ours = post(h, "/save_snapshot", {"session": "nulls"})  # ours: our id
    assert ours["snapshot_id"] == head


def test_failures_have_honest_statuses_and_their_success_false(h):
    post(h, "/save_snapshot", {"conversation_id": "never-seen", "turn_number": 1}, 404)
    post(h, "/save_snapshot", {"turn_number": 1}, 400)
    post(h, "/restore_snapshot", {"rid": "nonexistent-rid-xyz-999"}, 404)  # their "fails gracefully"
    post(h, "/get_snapshot_info", {"conversation_id": "never-seen", "turn_number": 0}, 404)
    post(h, "/delete_snapshot", {"conversation_id": "never-seen", "turn_number": 0}, 404)
    post(h, "/save_snapshot", {"conversation_id": "c", "turn_number": -1}, 400)


def test_list_unknown_conversation_is_an_empty_list(h):
    assert post(h, "/list_snapshots", {"conversation_id": "never-seen"}) == {"success": True, "snapshots": []}
    post(h, "/list_snapshots", {"conversation_id": "a/b"}, 400)  # an id outside their alphabet
    post(h, "/list_snapshots", {"session": "never-seen"}, 404)  # our `session` keeps ours: it does not exist


def test_branch_name_save_creates_then_moves_a_branch_session_without_copying(h, tok):
    first = chat(h, "tree", "Hello there")["engram"]["snapshot_id"]
    saved = post(h, "/save_snapshot", {"conversation_id": "tree", "branch_name": "alt"})
    assert saved["branch_name"] == "alt" and saved["branch_session"] == "tree.alt" and saved["id"] == first
    branch = h.get("/v1/sessions/tree.alt").json()
    assert branch["head"] == branch["base"] == first  # the same snapshot, not a copy
    post(h, "/save_snapshot", {"conversation_id": "tree", "branch_name": "b-first"})
    second = chat(h, "tree", "More")["engram"]["snapshot_id"]
    moved = post(h, "/save_snapshot", {"conversation_id": "tree", "branch_name": "alt"})
    assert moved["branch_session"] == "tree.alt" and h.get("/v1/sessions/tree.alt").json()["head"] == second
    listed = post(h, "/list_snapshots", {"conversation_id": "tree"})["snapshots"]
    # their order: turns by number, then branches by name
    assert [(s["turn_number"], s["branch_name"], s["id"]) for s in listed] == [
        (1, None, first),
        (2, None, second),
        (2, "alt", second),
        (1, "b-first", first),
    ]
    assert post(h, "/get_snapshot_info", {"conversation_id": "tree", "branch_name": "b-first"})["id"] == first
    # a turn on the branch continues the branch; the conversation stays where it was
    gen = post(
        h,
        "/restore_snapshot",
        {
            "conversation_id": "tree",
            "branch_name": "alt",
            "create_new_request": True,
            "continuation_ids": user_turn_ids(tok, "On the branch"),
            "max_new_tokens": 3,
        },
    )
    assert gen["session"] == "tree.alt" and gen["conversation_id"] == "tree" and gen["branch_name"] == "alt"
    assert h.get("/v1/sessions/tree").json()["head"] == second
    assert post(h, "/get_snapshot_info", {"conversation_id": "tree", "branch_name": "alt"})["id"] == gen["snapshot_id"]
    gone = post(h, "/delete_snapshot", {"conversation_id": "tree", "branch_name": "alt"})
    assert gone["session"] == "tree.alt" and h.get("/v1/sessions/tree.alt").status_code == 404
    assert [s["branch_name"] for s in post(h, "/list_snapshots", {"conversation_id": "tree"})["snapshots"]] == [
        None,
        None,
        "b-first",
    ]
    post(h, "/get_snapshot_info", {"conversation_id": "tree", "branch_name": "alt"}, 404)


def test_info_by_turn_and_branch_with_their_metadata(h, tok):
    r = chat(h, "info", "Hello there")
    info = post(h, "/get_snapshot_info", {"conversation_id": "info", "turn_number": 1})
    meta = info["metadata"]
    assert THEIR_ITEM <= set(meta) and meta["turn_number"] == 1 and meta["conversation_id"] == "info"
    assert meta["token_count"] == len(meta["fill_ids"]) == r["usage"]["total_tokens"]
    prompt = tok.encode(tok.render([{"role": "user", "content": "Hello there"}], add_generation_prompt=True))
    assert meta["fill_ids"][: len(prompt)] == prompt  # the tokens the state has consumed
    missing = post(h, "/get_snapshot_info", {"conversation_id": "info", "turn_number": 9}, 404)
    assert missing["message"] == "Snapshot not found: conversation=info, turn=9, branch=None."
    post(h, "/get_snapshot_info", {"conversation_id": "info", "branch_name": "nope"}, 404)


def test_restore_only_by_turn_rewinds_the_conversation(h):
    t1 = chat(h, "rewind", "Hello there")
    chat(h, "rewind", "More")
    r = post(h, "/restore_snapshot", {"conversation_id": "rewind", "turn_number": 1})
    assert r["snapshot_id"] == t1["engram"]["snapshot_id"] and r["turn_number"] == 1 and r["name"] == "rewind-t1"
    assert r["token_count"] == t1["usage"]["total_tokens"] and r["message"] and r["rid"] is None
    assert r["output_ids"] is None and r["output_text"] is None
    s = h.get("/v1/sessions/rewind").json()
    assert s["head"] == t1["engram"]["snapshot_id"] and len(s["messages"]) == 2
    # create_new_request without continuation_ids (their Phase 7 test): restored, with a new rid
    new = post(h, "/restore_snapshot", {"conversation_id": "rewind", "create_new_request": True})
    assert new["rid"].startswith("restored-") and new["snapshot_id"] == t1["engram"]["snapshot_id"]


def test_restore_and_generate_is_greedy_by_default_and_reproducible(h, tok, reference_backend):
    chat(h, "gen", "My favorite color is blue.")
    post(h, "/save_snapshot", {"conversation_id": "gen", "turn_number": 1})
    fill = post(h, "/get_snapshot_info", {"snapshot_id": "gen-t1"})["metadata"]["fill_ids"]
    ids = user_turn_ids(tok, "What is my favorite color?")
    body = {
        "conversation_id": "gen",
        "turn_number": 1,
        "create_new_request": True,
        "continuation_ids": ids,
        "max_new_tokens": 6,
        "request_id": "req-1",
    }
    a, b = post(h, "/restore_snapshot", body), post(h, "/restore_snapshot", body)
    assert a["output_ids"] == b["output_ids"] and a["output_text"] == b["output_text"]
    assert (a["output_ids"], a["output_text"]) == generate_from(
        reference_backend, fill + ids, temperature=0, max_tokens=6
    )
    assert 0 < len(a["output_ids"]) <= 6 and a["token_count"] == len(fill) and a["request_id"] == "req-1"
    assert a["rid"].startswith("restored-") and a["rid"] != b["rid"] and a["mamba_pool_idx"] is None
    # the generated turn is the conversation's turn 2, its new head
    assert a["session"] == "gen" and a["turn_number"] == 2 and a["name"] == "gen-t2"
    assert b["snapshot_id"] == h.get("/v1/sessions/gen").json()["head"] != a["snapshot_id"]
    usage = a["usage"]
    assert usage["prompt_tokens"] == len(fill) + len(ids)
    assert usage["prompt_tokens_details"]["cached_tokens"] == len(fill)  # the restored state: nothing recomputed


def test_a_restore_with_a_continuation_message_is_greedy_by_default_too(h):
    chat(h, "gentext", "My favorite color is blue.")
    post(h, "/save_snapshot", {"conversation_id": "gentext", "turn_number": 1})
    body = {"conversation_id": "gentext", "turn_number": 1, "continuation": "What is it?", "max_tokens": 8}
    replies = {h.post("/restore_snapshot", json=body).json()["choices"][0]["message"]["content"] for _ in range(3)}
    assert len(replies) == 1  # the tiny model's flat logits would make sampled replies differ
    forced = {**body, "temperature": 1.5, "seed": 7}
    a, b = (h.post("/restore_snapshot", json=forced).json()["choices"][0]["message"]["content"] for _ in range(2))
    assert a == b and a not in replies  # sampling as asked: seeded, and not the greedy reply


def test_restore_and_generate_honours_sampling_parameters(h, tok, reference_backend):
    chat(h, "sampled", "Tell me a story.")
    fill = post(h, "/get_snapshot_info", {"conversation_id": "sampled", "turn_number": 1})["metadata"]["fill_ids"]
    ids = user_turn_ids(tok, "Another one?")
    params = {"temperature": 1.3, "top_k": 40, "top_p": 0.95, "seed": 11}
    r = post(
        h,
        "/restore_snapshot",
        {"conversation_id": "sampled", "turn_number": 1, "continuation_ids": ids, "max_new_tokens": 8, **params},
    )
    assert (r["output_ids"], r["output_text"]) == generate_from(reference_backend, fill + ids, max_tokens=8, **params)
    greedy = post(
        h,
        "/restore_snapshot",
        {"conversation_id": "sampled", "turn_number": 1, "continuation_ids": ids, "max_new_tokens": 8},
    )
    assert (greedy["output_ids"], greedy["output_text"]) == generate_from(
        reference_backend, fill + ids, temperature=0, max_tokens=8
    )
    short = post(
        h,
        "/restore_snapshot",
        {"conversation_id": "sampled", "turn_number": 1, "continuation_ids": ids, "max_new_tokens": 2},
    )
    assert len(short["output_ids"]) <= 2 and short["finish_reason"] in ("stop", "length")


def test_restore_and_generate_refusals_change_nothing(h, tok):
    chat(h, "refuse", "Hello there")

    def stored():
        snaps = post(h, "/list_snapshots", {"session": "refuse"})["snapshots"]
        session = h.get("/v1/sessions/refuse").json()
        kept = [(s["snapshot_id"], s["parent"], s["tokens"], s["pinned"]) for s in snaps]
        return kept, session["head"], session["messages"]

    before = stored()
    ids = user_turn_ids(tok, "Go on")
    base = {"conversation_id": "refuse", "create_new_request": True, "continuation_ids": ids, "max_new_tokens": 2}
    for body, status, words in (
        ({**base, "conversation_id": "never-seen"}, 404, "never-seen"),
        ({**base, "turn_number": 7}, 404, "turn=7"),
        ({**base, "create_new_request": False}, 400, "create_new_request"),
        ({**base, "continuation_ids": [10**6]}, 400, "vocabulary"),
        ({**base, "continuation_ids": [-1]}, 400, "continuation_ids"),
        ({**base, "continuation": "text"}, 400, "not both"),
        ({**base, "stream": True}, 400, "stream"),
        ({**base, "max_new_tokens": 0}, 400, "max_new_tokens"),
        ({"conversation_id": "refuse", "max_new_tokens": 3}, 400, "max_new_tokens"),
    ):
        r = post(h, "/restore_snapshot", body, status)
        assert words in r["message"], (body, r)
    assert stored() == before


def test_delete_by_turn_or_branch(h):
    chat(h, "del", "Hello there")
    saved = post(h, "/save_snapshot", {"conversation_id": "del", "turn_number": 1})  # pinned, and the head
    gone = post(h, "/delete_snapshot", {"conversation_id": "del", "turn_number": 1})  # theirs deletes it anyway
    assert gone["snapshot_id"] == saved["id"] and gone["message"]
    post(h, "/get_snapshot_info", {"snapshot_id": saved["id"]}, 404)
    post(h, "/get_snapshot_info", {"snapshot_id": "del-t1"}, 404)
    post(h, "/delete_snapshot", {"conversation_id": "del", "turn_number": 1}, 404)
    post(h, "/delete_snapshot", {"conversation_id": "del", "branch_name": "none"}, 404)
    assert h.get("/v1/sessions/del").json()["n_messages"] == 2  # the conversation itself is still there


def test_conversation_id_on_chat_completions(h):
    a = chat(h, "named-conv", "Hello there")
    assert a["engram"]["session"] == "named-conv"
    b = helpers.chat(h, "named-conv", "More", 2)
    assert b["engram"]["restored_tokens"] == a["usage"]["total_tokens"]  # the same conversation
    r = h.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "session": "x",
            "conversation_id": "y",
            "messages": [{"role": "user", "content": "Hi"}],
        },
    )
    assert r.status_code == 400 and "same thing" in r.json()["error"]["message"]


def test_their_id_alphabet_and_length(h, tok):
    conv = "A-z_0.9" + "x" * 248  # 255 characters, their longest
    r = chat(h, conv, "Hello there")
    saved = post(h, "/save_snapshot", {"conversation_id": conv, "turn_number": 1, "branch_name": "b" * 255})
    assert saved["snapshot_id"] == f"{conv}-t1" and saved["conversation_id"] == conv
    assert post(h, "/get_snapshot_info", {"snapshot_id": f"{conv}-t1"})["id"] == r["engram"]["snapshot_id"]
    listed = post(h, "/list_snapshots", {"conversation_id": conv})["snapshots"]
    assert {s["conversation_id"] for s in listed} == {conv} and [s["branch_name"] for s in listed] == [None, "b" * 255]
    gen = post(
        h,
        "/restore_snapshot",
        {"conversation_id": conv, "continuation_ids": user_turn_ids(tok, "More?"), "max_new_tokens": 2},
    )
    assert gen["conversation_id"] == conv and gen["turn_number"] == 2
    for bad in (conv + "x", "bad id", "a/b", "..", ""):
        post(h, "/list_snapshots", {"conversation_id": bad}, 400)
        post(h, "/save_snapshot", {"conversation_id": bad, "turn_number": 1}, 400)
    post(h, "/save_snapshot", {"conversation_id": conv, "branch_name": "b" * 256}, 400)


def test_restore_and_generate_records_the_user_message_the_tokens_render(h, tok):
    chat(h, "recorded", "Hello there")
    alone = user_turn_ids(tok, "Their way?")  # the new message rendered alone (their clients)
    post(h, "/restore_snapshot", {"conversation_id": "recorded", "continuation_ids": alone, "max_new_tokens": 2})
    history = [{"role": m["role"], "content": m["content"]} for m in h.get("/v1/sessions/recorded").json()["messages"]]
    delta_text = tok.render(history + [{"role": "user", "content": "Our way?"}], add_generation_prompt=True)
    after = tok.render(history, add_generation_prompt=False)
    delta = tok.encode(delta_text[len(after) :])  # what comes after the conversation so far
    post(h, "/restore_snapshot", {"conversation_id": "recorded", "continuation_ids": delta, "max_new_tokens": 2})
    messages = h.get("/v1/sessions/recorded").json()["messages"]
    assert [(m["role"], m["content"]) for m in messages if m["role"] == "user"] == [
        ("user", "Hello there"),
        ("user", "Their way?"),
        ("user", "Our way?"),
    ]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 3


def test_their_live_server_flows_name_the_conversation_by_rid(h, tok, reference_backend):
    """Their live-server tests (test_mamba_snapshot_e2e.py, test_mamba_stateful_inference.py) as they drive
    a server: chat with `rid` resending the whole history, save by rid, restore by rid (back to what the save
    saved), restore with create_new_request, an unknown rid, then restore-and-generate by that name."""
    rid = "test-restore-1a2b3c4d"

    def chat_rid(messages: list[dict], **extra) -> dict:
        body = {"model": "default", "messages": messages, "max_tokens": 6, "temperature": 0, "rid": rid, **extra}
        r = h.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()

    history = [{"role": "user", "content": "My secret word is: ALPHA42."}]
    t1 = chat_rid(history)
    assert t1["engram"]["session"] == rid
    history.append({"role": "assistant", "content": t1["choices"][0]["message"]["content"]})
    saved = post(h, "/save_snapshot", {"rid": rid})
    assert saved["snapshot_id"] == f"{rid}-t1" and saved["id"] == t1["engram"]["snapshot_id"]

    with_t2 = history + [{"role": "user", "content": "What is my secret word?"}]
    original = chat_rid(with_t2)
    assert original["engram"]["restored_tokens"] == t1["usage"]["total_tokens"]  # the conversation continued
    restored = post(h, "/restore_snapshot", {"rid": rid})
    assert restored["snapshot_id"] == saved["id"] and restored["name"] == f"{rid}-t1"
    again = chat_rid(with_t2)
    assert again["choices"][0]["message"]["content"] == original["choices"][0]["message"]["content"]
    assert again["engram"]["restored_tokens"] == t1["usage"]["total_tokens"]  # from the save, not from turn 2
    # in our terms a restore of the session is its head: the turn just taken
    assert post(h, "/restore_snapshot", {"session": rid})["snapshot_id"] == again["engram"]["snapshot_id"]

    new = post(h, "/restore_snapshot", {"rid": rid, "create_new_request": True})
    assert new["rid"].startswith("restored-") and new["rid"] != rid and new["snapshot_id"] == saved["id"]
    missing = post(h, "/restore_snapshot", {"rid": "nonexistent-rid-xyz-999"}, 404)
    assert missing["success"] is False

    fill = post(h, "/get_snapshot_info", {"snapshot_id": saved["snapshot_id"]})["metadata"]["fill_ids"]
    ids = user_turn_ids(tok, "What is my secret word?")
    gen = post(
        h,
        "/restore_snapshot",
        {"conversation_id": rid, "create_new_request": True, "continuation_ids": ids, "max_new_tokens": 6},
    )
    assert (gen["output_ids"], gen["output_text"]) == generate_from(
        reference_backend, fill + ids, temperature=0, max_tokens=6
    )
    assert gen["token_count"] == len(fill) and gen["session"] == rid

    # conversation_id wins over rid (their key); a session that differs from either is refused
    assert chat_rid(with_t2, conversation_id="rid-loses")["engram"]["session"] == "rid-loses"
    r = h.post("/v1/chat/completions", json={"messages": with_t2, "rid": rid, "session": "other", "max_tokens": 2})
    assert r.status_code == 400 and "same thing" in r.json()["error"]["message"]
