"""The daemon loads a model on one thread and decodes on its worker thread: that must compute the very same
bits as loading and decoding on one thread. And the llama.cpp scripts/setup.sh builds has no OpenMP team
(with one, a decode from another thread than the loading one runs ~1.8x slower: docs/llama-threads.md).
The backend keeps one ggml thread pool for its context's life (engine/llama_threadpool.py) instead of the pool
ggml starts and joins for every graph: its decodes compute the same bits as with ggml's pool per graph, its
threads are the same ones from one decode to the next, and they end with the backend."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from engramctl.store import arrays


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 512, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(backend, prompt: list[int], steps: int) -> list[torch.Tensor]:
    live = backend.new_live()
    try:
        out = [backend.prefill(live, prompt).copy()]
        for _ in range(steps):
            out.append(backend.decode(live, int(out[-1].argmax())).copy())
        return out
    finally:
        backend.release(live)


def _load(path: Path, threads: int = 2):
    from engramctl.engine.loading import load_engine

    return load_engine(str(path), path.parent, "cpu", backend="llama.cpp", chunk_tokens=16, threads=threads).backend


def _threads() -> dict[int, int]:
    """This process's OS threads: tid -> nanoseconds it has run (schedstat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError):  # the thread ended meanwhile
            pass
    return out


def _on_thread(fn):
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("family", ["granitemoehybrid", "mamba2"])
def test_loaded_on_one_thread_decoded_on_another_gives_the_same_bits(gguf_zoo, load_llama, family):
    path = gguf_zoo.path(family)
    prompt = _ids(40, 3)
    here = load_llama(path)
    same_thread = _greedy(here, prompt, 12)
    other_thread = _on_thread(lambda: _greedy(here, prompt, 12))
    loaded_elsewhere = _on_thread(lambda: load_llama(path))
    decoded_here = _greedy(loaded_elsewhere, prompt, 12)
    for run in (other_thread, decoded_here):
        assert len(run) == len(same_thread)
        assert all(arrays.equal(a, b) for a, b in zip(same_thread, run))


def test_the_llama_cpp_library_runs_without_openmp():
    from engramctl.engine.llama_lib import openmp_linked
    from tests.gguf_factory import needs_llama_cpp

    if needs_llama_cpp():
        pytest.skip(needs_llama_cpp())
    assert not openmp_linked(), (
        "llama-cpp-python links OpenMP: rebuild it as scripts/setup.sh does (CMAKE_ARGS ... -DGGML_OPENMP=OFF)"
    )


@pytest.mark.parametrize("family", ["granitemoehybrid", "mamba2"])
def test_decodes_on_the_kept_pool_give_the_bits_of_a_pool_per_graph(gguf_zoo, family):
    backend = _load(gguf_zoo.path(family))
    prompt = _ids(40, 5)
    kept = _greedy(backend, prompt, 12)
    backend._threadpool.detach()  # ggml's default from here: a pool made for every graph
    per_graph = _greedy(backend, prompt, 12)
    assert len(kept) == len(per_graph) == 13
    assert all(arrays.equal(a, b) for a, b in zip(kept, per_graph))


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads threads from /proc")
def test_the_pool_threads_persist_across_decodes_and_end_with_the_backend(gguf_zoo):
    path = gguf_zoo.path("granitemoehybrid")
    _load(path).close()  # the library's own one-time threads (if any) start here, not below
    before = _threads()
    backend = _load(path, threads=3)
    pool = {tid for tid in _threads() if tid not in before}
    assert len(pool) >= 2, "two pool threads beside the caller's (threads=3) should start with the backend"
    ran = {tid: ns for tid, ns in _threads().items() if tid in pool}
    _greedy(backend, _ids(16, 6), 4)  # a few decodes: 3 threads busy-wait on 2 cores, each token is slow
    after = _threads()
    assert pool <= set(after), "the pool's threads ended between decodes"
    assert sum(after[t] > ran[t] for t in pool) >= 2, "the decodes did not run on the kept pool's threads"
    backend.close()  # ggml_threadpool_free joins them; the kernel drops a joined thread's /proc entry a moment later
    deadline = time.monotonic() + 5
    while pool & set(_threads()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pool & set(_threads()), "the pool's threads outlived the backend"
