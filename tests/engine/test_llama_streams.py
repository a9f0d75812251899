"""A KV stream per sequence (engine/llama_streams.py): attention-only models get one, on the real SmolLM2 GGUF;
their state blobs convert to and from the one-stream form every other part of engramctl knows, so a state
moves between the two layouts bitwise; a step of sequences that are not consecutive still runs each row as
alone; the scheduler feeds one prompt chunk a step there."""

from __future__ import annotations

import struct

import pytest

from engramctl.engine.engine import Engine
from engramctl.engine.llama_context import KV_BUDGET_BYTES
from engramctl.engine.llama_streams import of_streams, one_stream
from engramctl.errors import StateFormatError
from engramctl.store import arrays
from tests.engine.test_llama_batch import _alone

HEADER = struct.pack("<Ii", 0xAF143CD8, 0)


def _load(path, sequences: int, **kw):
    from engramctl.engine.llama_backend import LlamaCppBackend

    return LlamaCppBackend(path, path.name, chunk_tokens=128, sequences=sequences, **kw)


def _ids(seed: int, n: int) -> list[int]:
    return [100 + (7 * k + 13 * seed) % 3000 for k in range(n)]


def test_blobs_convert_between_one_stream_and_several():
    cells = struct.pack("<I", 3) + bytes(range(1, 61))  # a stream's entry: its cell count, then its data
    for n_stream in (2, 4):
        for own in range(n_stream):
            raw = HEADER + struct.pack("<I", n_stream) + bytes(4 * own) + cells + bytes(4 * (n_stream - 1 - own))
            one = one_stream(bytearray(raw))
            assert one == HEADER + struct.pack("<I", 1) + cells
            back, n = of_streams(one, n_stream)
            want = HEADER + struct.pack("<I", n_stream) + cells + bytes(4 * (n_stream - 1))
            assert back == want and n == len(want)
            assert one == HEADER + struct.pack("<I", 1) + cells  # of_streams leaves its argument as it was
            assert one_stream(back) == one
            # into a kept buffer holding an earlier, larger blob: the same bytes at its front, the rest ignored
            kept = bytearray(b"\xff" * (len(want) + 50))
            into, n = of_streams(one, n_stream, kept)
            assert into is kept and bytes(kept[:n]) == want
        empty = bytearray(HEADER + struct.pack("<I", n_stream) + bytes(4 * n_stream))
        assert one_stream(empty) == HEADER + struct.pack("<II", 1, 0)
    two = bytearray(HEADER + struct.pack("<I", 2) + cells + cells)  # cells in two streams: not one sequence's
    with pytest.raises(StateFormatError):
        one_stream(two)
    with pytest.raises(StateFormatError):
        of_streams(bytearray(HEADER + struct.pack("<I", 2) + cells + bytes(4)), 4)


def test_attention_only_models_get_a_stream_per_sequence(smol_path, gguf_zoo):
    smol = _load(smol_path, sequences=3)
    pool = smol._pool
    assert pool.streams and pool.kept_max == 0 and smol.prompts_per_step == 1
    kv_per_token = 30 * 2 * 2 * 3 * 64  # SmolLM2-135M: 30 layers, K and V, f16, 3 KV heads of 64
    assert smol.n_ctx == min(8192, KV_BUDGET_BYTES // 3 // kv_per_token // 256 * 256)  # each conversation's
    serial = _load(smol_path, sequences=1)  # one sequence: one cache, as before
    hybrid = _load(gguf_zoo.path("granitemoehybrid"), sequences=2)  # recurrent layers: unified, kept states
    for backend in (serial, hybrid):
        assert not backend._pool.streams and backend._pool.kept_max > 0 and backend.prompts_per_step is None


def test_a_state_moves_between_the_layouts_bitwise(smol_path):
    """A state captured after batched steps in streams restores into a unified context (sequences 1, as
    serial turns run) with the same bytes and continues there exactly as it does in its own stream; and back."""
    streams, unified = _load(smol_path, sequences=3), _load(smol_path, sequences=1)
    lives = [streams.new_live() for _ in range(3)]
    streams.step([(live, _ids(i, 40 + 30 * i)) for i, live in enumerate(lives)])  # unequal: several ubatches
    streams.step([(live, [int(live.last_logits.argmax())]) for live in lives])
    b = lives[1]
    state = streams.capture(b)
    assert len(state.token_ids) == 71
    moved = unified.inject(state)
    again = unified.capture(moved)
    for x, y in zip(state.layers, again.layers):
        for name, t in x.tensors().items():
            assert arrays.equal(t, y.tensors()[name])
    unified.release(moved)
    feeds = [[int(b.last_logits.argmax())], _ids(7, 9), [42]]
    here = [streams.step([(b, ids)])[0].copy() for ids in feeds]
    assert all(arrays.equal(x, y) for x, y in zip(here, _alone(unified, state, feeds)))
    # and a state from the unified context runs in a stream as it runs there
    back = _alone(streams, unified.capture(unified.inject(state)), feeds)
    assert all(arrays.equal(x, y) for x, y in zip(here, back))


def test_a_step_of_sequences_that_are_not_consecutive_runs_each_as_alone(smol_path):
    """llama.cpp puts only consecutive sequence ids in one ubatch: with the middle one released, a step of
    the first and the last runs as two, each row computing what it computes alone (fewer than 64 rows)."""
    smol, fresh = _load(smol_path, sequences=3), _load(smol_path, sequences=3)
    a, mid, c = (smol.new_live() for _ in range(3))
    smol.step([(a, _ids(1, 20)), (mid, _ids(2, 20)), (c, _ids(3, 20))])
    assert (a.cache.seq, mid.cache.seq, c.cache.seq) == (0, 1, 2)
    smol.release(mid)
    states = [smol.capture(a), smol.capture(c)]
    got = smol.step([(c, [11]), (a, [12])])  # out of order as well: the backend feeds them by sequence
    want = [_alone(fresh, states[1], [[11]])[0], _alone(fresh, states[0], [[12]])[0]]
    assert all(arrays.equal(x, y) for x, y in zip(got, want))


def test_the_scheduler_feeds_one_prompt_chunk_a_step_with_streams(smol_path, monkeypatch):
    """With a stream per sequence llama.cpp splits a step into ubatches of equal tokens per sequence, so
    prompts of unequal lengths in one step would run as several small ubatches: one prompt a step."""
    from engramctl.daemon.recorder import TurnRecord
    from engramctl.daemon.scheduler import Scheduler
    from engramctl.daemon.sequence import Sequence
    from engramctl.daemon.state_cache import Origin
    from engramctl.engine.sampling_params import SamplingParams
    from engramctl.engine.turn import Turn, TurnDone

    smol = _load(smol_path, sequences=3)
    engine = Engine(smol, smol.tokenizer)
    assert engine.prompts_per_step == 1
    turns: dict[int, Turn] = {}
    steps: list[list[bool]] = []  # per step: whether each piece is a prompt chunk
    real_step = engine.step

    def recording_step(work):
        steps.append([turns[id(live)].prefilling for live, _ in work])
        return real_step(work)

    monkeypatch.setattr(engine, "step", recording_step)
    s = Scheduler(engine, max_sequences=3)
    done = []
    for seed, n in ((1, 150), (2, 60), (3, 30)):
        params = SamplingParams(temperature=0.0, max_tokens=4)
        t = Turn.for_tokens(engine, engine.new_live(), _ids(seed, n), "", params)
        turns[id(t.live)] = t
        s.start(Sequence(t, f"s{seed}", Origin(), TurnRecord(f"s{seed}", None, []), 0.0))
    while s.busy:
        done += [event for _, event in s.step() if isinstance(event, TurnDone)]
    assert len(done) == 3 and all(len(d.finish.token_ids) == 4 for d in done)
    assert all(sum(step) <= 1 for step in steps)  # at most one prompt chunk a step
    assert any(sum(step) == 1 and len(step) > 1 for step in steps)  # beside the generating turns' tokens
