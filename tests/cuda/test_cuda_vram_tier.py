"""llama.cpp's VRAM tier on a GPU (issue 38 item 3; engine/llama_device_copies.py): a conversation parked with a
device copy of its state resumes from it bit for bit like the conversation that never stopped, for a hybrid and a
pure Mamba2 model. The same checks on the CPU build: tests/engine/test_llama_device_copies.py; the restore times:
scripts/vram_tier_probe.py (scripts/device_run.sh runs both).

Skipped unless llama-cpp-python offloads to a GPU and torch sees one; ENGRAM_LLAMA_TEST_DEVICE=cpu runs it on the
CPU build."""

from __future__ import annotations

import pytest

from engramctl.engine.llama_backend import LlamaCppBackend
from tests.cuda.test_cuda_llama import DEVICE, pytestmark  # noqa: F401 (the same skip)
from tests.engine.test_llama_device_copies import _equal, _greedy, _ids


def _load(path, copies_bytes):
    return LlamaCppBackend(path, path.name, chunk_tokens=16, sequences=2, device=DEVICE, copies_bytes=copies_bytes)


@pytest.mark.parametrize("family", ["granitemoehybrid", "mamba2"])
def test_a_parked_conversation_resumes_from_its_device_copy_bitwise_on_the_gpu(gguf_zoo, family):
    path = gguf_zoo.path(family)
    backend, reference = _load(path, 64 << 20), _load(path, 0)
    a_ids, b_ids, more = _ids(40, 1), _ids(25, 2), _ids(6, 3)
    ref = reference.new_live()
    reference.prefill(ref, a_ids + more)
    want = _greedy(reference, ref, 4)
    a, b = backend.new_live(), backend.new_live()
    backend.prefill(a, a_ids)
    backend.capture(a)
    backend.prefill(b, b_ids)  # a alone before: parked with a copy
    assert backend._pool.device.valid(a.cache.device)
    before = backend._pool.restores["device"]
    backend.prefill(a, more)
    assert backend._pool.restores["device"] == before + 1
    assert _equal(_greedy(backend, a, 4), want)
