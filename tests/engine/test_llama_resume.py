"""llama.cpp backend, invariant 1: a snapshot written to a real snapshot file and restored in a fresh
process continues bit for bit like the run that never stopped, for every architecture it serves."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import in_fresh_process
from tests.snapshot_io import write_state
from tests.gguf_factory import LLAMA_FAMILIES

N_TOKENS, MORE_TOKENS, GREEDY, CHUNK = 40, 8, 16, 16


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def resume_run_on(gguf_zoo, load_llama, work, device: str = "cpu", families=LLAMA_FAMILIES) -> tuple[dict, dict]:
    """Parent: prefill N, write the snapshot, then the uninterrupted run (same calls, no snapshot).
    Child (one fresh process for all families): restore, feed M more, decode greedily. On `device`, both
    (tests/cuda/test_cuda_llama.py runs it on the GPU)."""
    gguf_zoo.ensure(families)
    ids = _ids(N_TOKENS + MORE_TOKENS, seed=1)
    jobs, refs = [], {}
    for fam in families:
        path = gguf_zoo.path(fam)
        backend = load_llama(path, chunk_tokens=CHUNK, device=device)
        live = backend.new_live()
        backend.prefill(live, ids[:N_TOKENS])
        snap = work / f"{fam}.safetensors"
        write_state(snap, backend.capture(live), backend.spec)
        logits = backend.prefill(live, ids[N_TOKENS:])  # the same Live goes on: nothing was restored
        continued, greedy = torch.from_numpy(logits.copy()), []
        for _ in range(GREEDY):
            greedy.append(int(logits.argmax()))
            logits = backend.decode(live, greedy[-1])
        fresh = backend.prefill(backend.new_live(), ids[N_TOKENS:])  # what a lost state would give
        refs[fam] = {
            "continued": continued,
            "greedy": greedy,
            "final": torch.from_numpy(logits),
            "fresh": torch.from_numpy(fresh),
        }
        job = {"family": fam, "gguf": str(path), "snapshot": str(snap), "more_ids": ids[N_TOKENS:]}
        jobs.append(job | {"greedy": GREEDY, "chunk_tokens": CHUNK, "device": device})
    return refs, in_fresh_process("tests.engine._resume_child", work, jobs)


@pytest.fixture(scope="module")
def resume_run(gguf_zoo, load_llama, tmp_path_factory):
    return resume_run_on(gguf_zoo, load_llama, tmp_path_factory.mktemp("llama-resume"))


def check_resumed(refs: dict, got: dict, family: str) -> None:
    ref = refs[family]
    assert torch.equal(got[f"{family}.continued_logits"], ref["continued"])
    assert got[f"{family}.greedy"].tolist() == ref["greedy"]
    assert torch.equal(got[f"{family}.final_logits"], ref["final"])
    # the check can fail: without the restored state the same tokens give other logits
    assert not torch.allclose(got[f"{family}.continued_logits"], ref["fresh"], atol=1e-3)


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_restored_state_continues_bitwise_in_a_fresh_process(resume_run, family):
    check_resumed(*resume_run, family)
