"""The llama.cpp backend on a CUDA build and a GPU (issue 38 items 4 and 5), each tiny GGUF of
tests/gguf_factory.py:
- a state captured on the GPU, written to a snapshot file and restored by a fresh process on the GPU continues
  bitwise like the run that never stopped (the CPU's invariant, tests/engine/test_llama_resume.py, on CUDA);
- a snapshot written by the CPU build restores on the GPU and continues within llama.cpp's CUDA tolerance of the GPU's
  own uninterrupted run (2e-3: tests/cuda/_common.py LLAMA_CUDA_TOLERANCE, docs/gpu.md "Tolerance"; 1e-4 when
  DEVICE is the CPU) with the same greedy tokens;
- 16 conversations stepped together in one llama_decode on the GPU each get their own conversation's logits
  (within the same tolerance of each run alone, the same greedy token).

Skipped unless llama-cpp-python offloads to a GPU and torch sees one. ENGRAM_LLAMA_TEST_DEVICE=cpu runs the same
checks on the CPU build (how this file was checked on a machine without a GPU)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from engramctl.errors import EngramError
from tests.cuda._common import HAS_CUDA, llama_tolerance, record
from tests.engine.test_llama_resume import GREEDY, MORE_TOKENS, N_TOKENS, _ids, check_resumed, resume_run_on
from tests.gguf_factory import LLAMA_FAMILIES
from tests.helpers import in_fresh_process
from tests.snapshot_io import write_state

DEVICE = os.environ.get("ENGRAM_LLAMA_TEST_DEVICE", "cuda")
AT_ONCE = 16


def _offloads() -> bool:
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_gpu_offload())


pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not (HAS_CUDA and _offloads()),
    reason="needs llama-cpp-python built with CUDA and a GPU (docs/gpu.md)",
)


@pytest.fixture(scope="module")
def gpu_resume(gguf_zoo, load_llama, tmp_path_factory):
    return resume_run_on(gguf_zoo, load_llama, tmp_path_factory.mktemp("llama-gpu-resume"), device=DEVICE)


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_a_gpu_state_restored_in_a_fresh_process_continues_bitwise(gpu_resume, family):
    check_resumed(*gpu_resume, family)


@pytest.fixture(scope="module")
def cpu_snapshots_on_gpu(gguf_zoo, load_llama, tmp_path_factory):
    """Snapshots the CPU build writes, restored by a fresh process on DEVICE; the reference is DEVICE's own
    uninterrupted run of the same tokens."""
    work = tmp_path_factory.mktemp("llama-cpu-to-gpu")
    gguf_zoo.ensure(LLAMA_FAMILIES)
    ids = _ids(N_TOKENS + MORE_TOKENS, seed=1)
    jobs, refs = [], {}
    for fam in LLAMA_FAMILIES:
        path = gguf_zoo.path(fam)
        cpu = load_llama(path, chunk_tokens=16, device="cpu")
        live = cpu.new_live()
        cpu.prefill(live, ids[:N_TOKENS])
        write_state(work / f"{fam}.safetensors", cpu.capture(live), cpu.spec)
        gpu = load_llama(path, chunk_tokens=16, device=DEVICE)
        ref = gpu.new_live()
        gpu.prefill(ref, ids[:N_TOKENS])
        logits, greedy = gpu.prefill(ref, ids[N_TOKENS:]), []
        continued = torch.from_numpy(logits.copy())
        for _ in range(GREEDY):
            greedy.append(int(logits.argmax()))
            logits = gpu.decode(ref, greedy[-1])
        refs[fam] = {"continued": continued, "greedy": greedy}
        job = {"family": fam, "gguf": str(path), "snapshot": str(work / f"{fam}.safetensors")}
        jobs.append(job | {"more_ids": ids[N_TOKENS:], "greedy": GREEDY, "chunk_tokens": 16, "device": DEVICE})
    return refs, in_fresh_process("tests.engine._resume_child", work, jobs)


@pytest.mark.parametrize("family", LLAMA_FAMILIES)
def test_a_cpu_snapshot_continues_on_the_gpu_within_the_tolerance(cpu_snapshots_on_gpu, family):
    refs, got = cpu_snapshots_on_gpu
    diff = (got[f"{family}.continued_logits"] - refs[family]["continued"]).abs().max().item()
    record("llama_cuda_cpu_snapshot", family, diff)
    assert diff <= llama_tolerance(DEVICE), diff
    assert got[f"{family}.greedy"].tolist() == refs[family]["greedy"]


def test_sixteen_conversations_step_together_each_on_its_own_state(gguf_zoo, load_llama):
    backend = load_llama(gguf_zoo.path("granitemoehybrid"), chunk_tokens=512, device=DEVICE, sequences=AT_ONCE)
    if backend.max_sequences < AT_ONCE:
        pytest.skip(f"the context serves {backend.max_sequences} at once here")
    prompts = [_ids(5 + 3 * k, seed=20 + k) for k in range(AT_ONCE)]
    lives = [backend.new_live() for _ in prompts]
    try:
        got = [x.copy() for x in backend.step(list(zip(lives, prompts)))]
        assert len({live.cache.seq for live in lives}) == AT_ONCE  # one llama_decode, a sequence each
    except EngramError as e:
        pytest.fail(f"16 at once refused: {e.message}")
    worst = 0.0
    for logits, prompt in zip(got, prompts):
        alone = backend.new_live()
        want = backend.prefill(alone, prompt)
        worst = max(worst, float(np.abs(logits - want).max()))
        assert int(logits.argmax()) == int(want.argmax())
        backend.release(alone)
    record("llama_cuda_batch", "max_abs_diff_vs_alone", worst)
    assert worst <= llama_tolerance(DEVICE), worst
    assert not np.allclose(got[0], got[1], atol=1e-2)  # the check can fail: conversations differ
    for live in lives:
        backend.release(live)
