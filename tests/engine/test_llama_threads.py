"""The daemon loads a model on one thread and decodes on its worker thread: that must compute the very same
bits as loading and decoding on one thread. And the llama.cpp scripts/setup.sh builds has no OpenMP team
(with one, a decode from another thread than the loading one runs ~1.8x slower: docs/llama-threads.md)."""

from __future__ import annotations

import threading

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
