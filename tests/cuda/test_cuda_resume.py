"""Invariant 1 on a CUDA GPU: a snapshot taken from a model on the GPU, written to a snapshot file,
restored in a fresh process into a fresh cache on the GPU, continues exactly.

Per family of tests/factory.py (tiny random models, the transformers backend on device "cuda"; the
chunked families are the point, the token-by-token Mamba1 ones and the llama control ride along):
prefill 40 tokens in chunks of 16, capture, encode the snapshot file (engramctl/store/snapshot_file.py),
decode and verify it in a child process, inject it, feed 8 more tokens, decode 16 greedy tokens.
- float32: logits within 1e-4 of one full no-cache forward, the same greedy tokens as an uninterrupted
  prefill, and bit-for-bit the logits of an uninterrupted run that takes the same chunks (the restored
  cache is the same bytes, so the same kernels see the same inputs);
- bfloat16 (one family): the same bit-for-bit continuation, and a tolerance against the full forward
  derived from bf16 itself (see test_bf16_restore_on_cuda_continues_exactly);
- a bf16 snapshot is refused by a float32 model (and the reverse), with a message naming both dtypes;
- a CPU-captured float32 snapshot restores on the GPU (same fingerprint) and continues within 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engramctl.engine.families import RECURRENT_FAMILIES
from engramctl.errors import SnapshotMismatch
from engramctl.state.codec import to_payload
from tests.helpers import in_fresh_process
from tests.snapshot_io import read_state, state_metadata, write_state
from engramctl.store import snapshot_file
from tests.cuda._common import load_backend, max_diff, record, requires_cuda, token_ids
from tests.factory import FAMILIES

pytestmark = requires_cuda

N_TOKENS, MORE_TOKENS, GREEDY = 40, 8, 16
TOL = 1e-4
BF16_FAMILY = "granitemoehybrid"  # the default target's family (IBM Granite 4.0-H)
CHUNKED = [f for f in FAMILIES if not (f in RECURRENT_FAMILIES and RECURRENT_FAMILIES[f].token_by_token)]


def _greedy(backend, live, logits, n: int) -> tuple[list[int], torch.Tensor]:
    tokens, steps = [], []
    for _ in range(n):
        tokens.append(int(torch.argmax(logits)))
        logits = backend.decode(live, tokens[-1])
        steps.append(logits.float().cpu().clone())
    return tokens, torch.stack(steps)


def _full(backend, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():  # no cache at all: the reference
        return backend.model(input_ids=torch.tensor([ids], device=backend.device)).logits[0].float().cpu()


def _all_cuda(state) -> bool:
    return state.last_logits.is_cuda and all(t.is_cuda for layer in state.layers for t in layer.tensors().values())


def _reference_run(backend, ids: list[int], snap: Path) -> dict:
    """Prefill N, snapshot it, then go on uninterrupted (same chunks) and, separately, straight."""
    live = backend.new_live()
    backend.prefill(live, ids[:N_TOKENS])
    state = backend.capture(live)
    write_state(snap, state, backend.spec)
    tensors, meta = to_payload(state, backend.spec, state_metadata())
    back, _ = snapshot_file.decode(snapshot_file.encode(tensors, meta))
    cont = backend.prefill(live, ids[N_TOKENS:]).float().cpu().clone()
    greedy_u, steps_u = _greedy(backend, live, cont, GREEDY)
    straight = backend.new_live()
    greedy_s, _ = _greedy(backend, straight, backend.prefill(straight, ids), GREEDY)
    return {
        "captured_logits": state.last_logits.float().cpu().clone(),
        "captured_on_cuda": _all_cuda(state),
        "file_roundtrip_exact": set(back) == set(tensors)
        and all(torch.equal(back[k], tensors[k].cpu()) for k in tensors),
        "continued": cont,
        "steps": steps_u,
        "greedy_u": greedy_u,
        "greedy_s": greedy_s,
        "full": _full(backend, ids),
        "fingerprint": backend.info.fingerprint,
    }


@pytest.fixture(scope="module")
def resume_run(zoo, tmp_path_factory):
    """Parent: reference runs and snapshot files. Child (one fresh process for all jobs): restore on CUDA."""
    work = tmp_path_factory.mktemp("cuda-resume")
    ids = token_ids(N_TOKENS + MORE_TOKENS, seed=1)
    refs, jobs = {}, []

    def job(key: str, model_dir: Path, dtype: str, snap: Path) -> None:
        jobs.append(
            {
                "key": key,
                "model_dir": str(model_dir),
                "dtype": dtype,
                "snapshot": str(snap),
                "more_ids": ids[N_TOKENS:],
                "greedy": GREEDY,
            }
        )

    for fam in FAMILIES:
        model_dir = zoo.path(fam)
        gpu = load_backend(model_dir, torch.float32)
        refs[f"{fam}-float32"] = _reference_run(gpu, ids, work / f"{fam}-float32.safetensors")
        job(f"{fam}-float32", model_dir, "float32", work / f"{fam}-float32.safetensors")
        cpu = load_backend(model_dir, torch.float32, device="cpu")
        live = cpu.new_live()
        cpu.prefill(live, ids[:N_TOKENS])
        write_state(work / f"{fam}-fromcpu.safetensors", cpu.capture(live), cpu.spec)
        job(f"{fam}-fromcpu", model_dir, "float32", work / f"{fam}-fromcpu.safetensors")
        refs[f"{fam}-fromcpu"] = {"cpu_full": _full(cpu, ids), "cpu_fingerprint": cpu.info.fingerprint}
        if fam == BF16_FAMILY:
            bf16 = load_backend(model_dir, torch.bfloat16)
            refs[f"{fam}-bfloat16"] = _reference_run(bf16, ids, work / f"{fam}-bfloat16.safetensors")
            refs[f"{fam}-bfloat16"]["spec_dtype"] = bf16.spec.dtype
            job(f"{fam}-bfloat16", model_dir, "bfloat16", work / f"{fam}-bfloat16.safetensors")
            del bf16
        del gpu, cpu
    torch.cuda.empty_cache()
    return refs, in_fresh_process("tests.cuda._resume_child", work, jobs), work


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_restore_on_cuda_continues_exactly(resume_run, family):
    refs, got, _ = resume_run
    key = f"{family}-float32"
    ref = refs[key]
    full = ref["full"]
    restored, continued = got[f"{key}.restored_logits"], got[f"{key}.continued_logits"]
    d_restored = max_diff(restored, full[N_TOKENS - 1])
    d_continued = max_diff(continued, full[-1])
    d_uninterrupted = max(max_diff(continued, ref["continued"]), max_diff(got[f"{key}.steps"], ref["steps"]))
    d_cpu = max_diff(full, refs[f"{family}-fromcpu"]["cpu_full"])
    record(
        "fp32_resume",
        family,
        {
            "restored_vs_full": d_restored,
            "continued_vs_full": d_continued,
            "restored_run_vs_uninterrupted": d_uninterrupted,
            "cuda_vs_cpu_full": d_cpu,
            "chunked": family in CHUNKED,
        },
    )
    assert ref["captured_on_cuda"] and bool(got[f"{key}.on_cuda"])  # the state lives on the GPU both ends
    assert ref["file_roundtrip_exact"] and bool(got[f"{key}.inject_exact"])
    assert torch.equal(restored, ref["captured_logits"])
    assert d_restored <= TOL and d_continued <= TOL
    assert got[f"{key}.greedy"].tolist() == ref["greedy_s"] == ref["greedy_u"]
    assert d_uninterrupted == 0.0  # bit-for-bit the run that never stopped
    # the check can fail: a fresh state does not produce these logits
    assert max_diff(continued, full[MORE_TOKENS - 1]) > TOL


def test_bf16_restore_on_cuda_continues_exactly(resume_run):
    """bf16 keeps 8 significant bits (relative rounding 2**-9 per operation), so a chunked run and one
    full forward, which round in different places, legitimately differ by far more than 1e-4. The
    tolerance is measured, not guessed: bf16's own error, the largest gap between the bf16 full forward
    and the float32 full forward of the same weights at any position. A restored run may be off by at
    most twice that from the float32 truth (each bf16 path carries about one such error), so resuming
    costs no more accuracy than running in bf16 at all; against the bf16 full forward that gives three
    times it (triangle inequality). The restored run must still be bit-for-bit the
    uninterrupted bf16 run that takes the same chunks."""
    refs, got, _ = resume_run
    key = f"{BF16_FAMILY}-bfloat16"
    ref, truth = refs[key], refs[f"{BF16_FAMILY}-float32"]["full"]
    assert ref["spec_dtype"] == "bfloat16"
    floor = max_diff(ref["full"], truth)
    restored, continued = got[f"{key}.restored_logits"], got[f"{key}.continued_logits"]
    err = max(max_diff(restored, truth[N_TOKENS - 1]), max_diff(continued, truth[-1]))
    d_full = max(max_diff(restored, ref["full"][N_TOKENS - 1]), max_diff(continued, ref["full"][-1]))
    d_uninterrupted = max(max_diff(continued, ref["continued"]), max_diff(got[f"{key}.steps"], ref["steps"]))
    record(
        "bf16_resume",
        BF16_FAMILY,
        {
            "bf16_full_vs_fp32_full": floor,
            "restored_vs_fp32_full": err,
            "restored_vs_bf16_full": d_full,
            "restored_run_vs_uninterrupted": d_uninterrupted,
            "logit_scale": truth.abs().max().item(),
            "greedy_equal_straight": got[f"{key}.greedy"].tolist() == ref["greedy_s"],
        },
    )
    assert ref["captured_on_cuda"] and bool(got[f"{key}.on_cuda"])
    assert ref["file_roundtrip_exact"] and bool(got[f"{key}.inject_exact"])
    assert torch.equal(restored, ref["captured_logits"])
    assert floor > TOL  # bf16 really ran (a float32 model would sit far below this)
    assert err <= 2 * floor
    assert d_full <= 3 * floor  # |restored - bf16 full| <= |restored - truth| + |truth - bf16 full|
    assert d_uninterrupted == 0.0
    assert got[f"{key}.greedy"].tolist() == ref["greedy_u"]


def test_bf16_snapshot_is_refused_by_a_float32_model_and_back(resume_run, zoo):
    _, _, work = resume_run
    model_dir = zoo.path(BF16_FAMILY)
    fp32, bf16 = load_backend(model_dir, torch.float32), load_backend(model_dir, torch.bfloat16)
    assert fp32.info.fingerprint == bf16.info.fingerprint  # same weights: only the dtype tells them apart
    with pytest.raises(SnapshotMismatch, match="written by a bfloat16 model; the loaded model runs float32") as e:
        read_state(work / f"{BF16_FAMILY}-bfloat16.safetensors", fp32.spec)
    assert "--dtype bfloat16" in (e.value.hint or "")
    with pytest.raises(SnapshotMismatch, match="written by a float32 model; the loaded model runs bfloat16"):
        read_state(work / f"{BF16_FAMILY}-float32.safetensors", bf16.spec)
    assert read_state(work / f"{BF16_FAMILY}-bfloat16.safetensors", bf16.spec).n_tokens == N_TOKENS


@pytest.mark.parametrize("family", CHUNKED)
def test_cpu_snapshot_restores_on_cuda(resume_run, family):
    """Fingerprints ignore the device, so a store filled on a CPU machine resumes on a GPU one."""
    refs, got, _ = resume_run
    key = f"{family}-fromcpu"
    full = refs[f"{family}-float32"]["full"]
    assert refs[key]["cpu_fingerprint"] == refs[f"{family}-float32"]["fingerprint"]
    d = max(
        max_diff(got[f"{key}.restored_logits"], full[N_TOKENS - 1]), max_diff(got[f"{key}.continued_logits"], full[-1])
    )
    record("cpu_snapshot_on_cuda", family, d)
    assert bool(got[f"{key}.on_cuda"]) and bool(got[f"{key}.inject_exact"])
    assert d <= TOL
    assert got[f"{key}.greedy"].tolist() == refs[f"{family}-float32"]["greedy_s"]
