"""Kept states (engine/llama_pool.py): a captured state stays resident in a sequence of its own, and
restoring it copies nothing yet gives the same bits; kept states go when their captured state is
collected, beyond the cap, when a shorter one is restored, and all when another path is loaded, so that
they never change another conversation's bits."""

from __future__ import annotations

import gc

import pytest
import torch

from engramctl.engine.llama_state import SEQ_ID
from engramctl.store import arrays


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module")
def granite(gguf_zoo, load_llama):
    return load_llama(gguf_zoo.path("granitemoehybrid"), chunk_tokens=16)


def _greedy(backend, live, steps: int) -> list[torch.Tensor]:
    out = [live.last_logits.copy()]
    for _ in range(steps):
        out.append(backend.decode(live, int(out[-1].argmax())).copy())
    return out


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(arrays.equal(x, y) for x, y in zip(a, b))


def test_a_kept_state_restores_without_a_copy_and_continues_bit_for_bit(granite):
    prompt, message = _ids(40, 1), _ids(7, 2)
    ref = granite.new_live()
    granite.prefill(ref, prompt + message)
    want = _greedy(granite, ref, 6)
    granite.release(ref)

    live = granite.new_live()
    granite.prefill(live, prompt)
    state = granite.capture(live)
    assert granite._pool.kept >= 1 and live.cache.kept is not None
    granite.prefill(live, _ids(9, 3))  # the live state moves on, sharing the kept state's cells
    before = granite._pool.restores["kept"]
    for _ in range(2):  # twice: a kept state survives being restored (regenerate)
        again = granite.inject(state)
        assert granite._pool.restores["kept"] == before + 1
        granite.prefill(again, message)
        assert _equal(_greedy(granite, again, 6), want)
        before += 1
    granite.prefill(live, message)  # the older Live still goes on from its own state
    assert live.token_ids[:40] == prompt and len(live.token_ids) == 56


def test_a_live_parked_at_a_kept_state_parks_without_a_copy(granite):
    a, b = granite.new_live(), granite.new_live()
    granite.prefill(a, _ids(30, 4))
    state = granite.capture(a)  # kept while it lives (the daemon's RAM tier holds it)
    kept_blob = granite._pool._kept[a.cache.kept].blob
    granite.prefill(b, _ids(12, 5))  # parks a
    assert a.cache.blob is kept_blob  # the captured blob, not a fresh copy
    more = _ids(5, 6)
    ref = granite.new_live()
    granite.prefill(ref, a.token_ids + more)
    assert arrays.equal(granite.prefill(a, more), ref.last_logits)
    for live in (a, b, ref):
        granite.release(live)
    del state


def test_kept_states_go_with_their_captured_state_and_beyond_the_cap(granite):
    live = granite.new_live()
    states = []
    for i in range(granite._pool.kept_max + 2):
        granite.prefill(live, _ids(5, 10 + i))
        states.append(granite.capture(live))
    assert granite._pool.kept == granite._pool.kept_max  # the oldest went
    oldest = granite.inject(states[0])  # no longer kept: loaded from its blob, same state
    assert granite._pool.restores["blob"] >= 1 and oldest.token_ids == list(states[0].token_ids)
    granite.release(oldest)
    granite.release(live)
    del states, oldest
    gc.collect()
    assert granite._pool.kept == 0  # the collector's finalizers queued them; the next look applies the queue
    pos = granite._lib.llama_memory_seq_pos_max
    assert all(pos(granite._pool._mem, seq) == -1 for seq in range(SEQ_ID, granite._pool.n_seq))


def test_restoring_a_kept_state_drops_the_longer_ones_and_another_path_drops_all(granite):
    live = granite.new_live()
    granite.prefill(live, _ids(20, 20))
    short = granite.capture(live)
    granite.prefill(live, _ids(20, 21))
    long = granite.capture(live)
    granite.release(live)
    assert granite._pool.kept == 2
    again = granite.inject(short)  # its cells are a prefix of `long`'s: `long` goes, or the context would hold more
    assert granite._pool.kept == 1 and granite._pool.last_position() == 19
    other = granite.new_live()
    granite.prefill(other, _ids(8, 22))  # another path: kept states are never a prefix of it
    assert granite._pool.kept == 0
    assert granite._pool.original(long) is not None  # still restorable, by one copy
    for x in (again, other):
        granite.release(x)


def test_kept_states_never_change_the_bits_of_another_conversation(granite):
    """Attention reads every used KV cell and splits 512+ of them across threads: a kept state of another
    conversation in the context would change a turn's last bits against a fresh process's."""
    granite._pool.restores.clear()
    x = granite.new_live()
    granite.prefill(x, _ids(300, 30))
    held = granite.capture(x)  # 300 cells, kept
    granite.release(x)
    y = granite.new_live()
    granite.prefill(y, _ids(300, 31))  # would straddle other thread chunks of the KV cells than alone
    got = _greedy(granite, y, 4)
    granite.release(y)
    del held
    assert granite._pool.kept == 0  # nothing of x left: the reference runs alone in the context
    ref = granite.new_live()
    granite.prefill(ref, _ids(300, 31))
    assert _equal(_greedy(granite, ref, 4), got)
    granite.release(ref)
