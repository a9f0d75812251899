"""Shared prefixes (engine/llama_pool.py `share`, LlamaCppBackend.share_prefix): a new conversation whose
prompt begins as a resident one's starts from that one's KV cells for the common part, on the real SmolLM2
GGUF (attention only). Its state is then its own, bitwise; models that keep recurrent state share nothing."""

from __future__ import annotations

import numpy as np

from engramctl.engine.llama_context import SHARE_MIN_TOKENS
from engramctl.store import arrays
from tests.engine.test_llama_batch import _alone

SYSTEM = "You are a careful assistant for a home lab. Answer in one short sentence, and never use lists."


def _load(path, sequences: int):
    from engramctl.engine.llama_backend import LlamaCppBackend

    return LlamaCppBackend(path, path.name, chunk_tokens=256, sequences=sequences)


def _prompt(backend, question: str) -> list[int]:
    tok = backend.tokenizer
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return tok.encode(tok.render(messages, add_generation_prompt=True))


def _common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_a_prompt_starts_from_the_cells_of_a_resident_conversation_and_its_state_is_its_own(smol_path):
    smol, fresh = _load(smol_path, sequences=2), _load(smol_path, sequences=2)
    first, second = _prompt(smol, "What is a NAS?"), _prompt(smol, "Why use ZFS snapshots?")
    common = _common(first, second)
    assert common >= SHARE_MIN_TOKENS  # the system prompt and the template's opening
    a = smol.new_live()
    smol.step([(a, first)])
    b = smol.new_live()
    assert smol.share_prefix(b, second[:-1]) == common
    assert b.token_ids == second[:common] and smol._pool.shares == 1
    smol.step([(b, second[common:]), (a, [int(a.last_logits.argmax())])])

    got_a, got_b = smol.capture(a), smol.capture(b)
    for la, lb in zip(got_a.layers, got_b.layers):  # the shared positions hold a's cells, byte for byte
        for name in ("keys", "values"):
            ta, tb = la.tensors()[name], lb.tensors()[name]
            assert np.array_equal(ta[:, :common].view(np.uint16), tb[:, :common].view(np.uint16))
            assert not np.array_equal(ta[:, common : len(second)], tb[:, common:])  # and then its own
    # b's state is b's: stepped alone here it computes what it computes restored in a fresh process
    feeds = [[int(b.last_logits.argmax())], [13], [42]]
    mine = [smol.step([(b, ids)])[0].copy() for ids in feeds]
    assert all(arrays.equal(x, y) for x, y in zip(mine, _alone(fresh, got_b, feeds)))
    # and, the prompts being under 64 tokens (ggml's small-batch kernels, where a row's bits do not depend on
    # how the prompt was cut into chunks: docs/batching.md), exactly what the same prompt computed from nothing
    # gives; a wrong prefix would not
    assert len(second) < 64
    ref = fresh.new_live()
    fresh.prefill(ref, second)
    assert arrays.equal(ref.last_logits, got_b.last_logits)


def test_of_two_sources_sharing_as_much_the_captured_one_gives_its_cells_without_a_copy(smol_path, monkeypatch):
    smol = _load(smol_path, sequences=3)
    first, second, third = (_prompt(smol, q) for q in ("What is a NAS?", "Why use ZFS snapshots?", "How big is 1 TB?"))
    common = _common(first, third)
    assert common == _common(second, third) >= SHARE_MIN_TOKENS
    a, b = smol.new_live(), smol.new_live()
    smol.step([(a, first), (b, second)])
    smol.step([(a, [int(a.last_logits.argmax())])])  # b is now the least recently stepped
    kept = smol.capture(a)  # a's blob is at hand until a steps again; b's cells would have to be copied out first
    copies = []
    real = smol._pool.get_blob
    monkeypatch.setattr(smol._pool, "get_blob", lambda *args: copies.append(args) or real(*args))
    c = smol.new_live()
    assert smol.share_prefix(c, third[:-1]) == common and copies == [] and kept.n_tokens == len(first) + 1
    assert c.token_ids == third[:common]


def test_nothing_is_shared_below_the_minimum_nor_with_itself(smol_path):
    smol = _load(smol_path, sequences=2)
    first = _prompt(smol, "What is a NAS?")
    a = smol.new_live()
    smol.step([(a, first)])
    b = smol.new_live()
    assert smol.share_prefix(b, first[: SHARE_MIN_TOKENS - 1]) == 0 and not b.token_ids
    assert smol.share_prefix(a, first) == 0  # a state that holds tokens takes none
    c = smol.new_live()
    assert smol.share_prefix(c, [t + 1 for t in first]) == 0  # no common prefix
    assert smol._pool.shares == 0


def test_one_conversation_at_a_time_or_recurrent_state_shares_nothing(smol_path, gguf_zoo):
    serial = _load(smol_path, sequences=1)  # replies bitwise reproducible: every prompt computed whole
    hybrid = _load(gguf_zoo.path("granitemoehybrid"), sequences=2)  # a recurrent state cannot be cut back
    for backend in (serial, hybrid):
        ids = list(range(3, 40))
        a = backend.new_live()
        backend.step([(a, ids)])
        b = backend.new_live()
        assert backend.share_prefix(b, ids + [7]) == 0 and not b.token_ids
