"""Raw llama-cpp-python on the same GGUF: the floor engramctl's llama.cpp backend is measured against.

    ref = RawLlama(path, n_ctx=..., n_batch=..., threads=...)
    ref.prefill(ids)                  # logits of the last token are ready in llama.cpp
    ref.decode_greedy(first, n)       # n single-token decodes, each reading the logits and taking argmax

It is what a llama.cpp example program does through the low-level C API, nothing more: its own model
(the same file, memory-mapped the same way) and context (the same n_ctx, n_batch = n_ubatch, threads and
flash attention as the backend, and one ggml thread pool kept for the context's life, as llama.cpp's own
programs attach through common.cpp and the backend does: engine/llama_threadpool.py), `llama_batch_get_one`
batches (positions and the last-token logits are llama.cpp's defaults), argmax over the logits in place
with numpy. No sessions, no state capture, no torch, no tokenizer: every millisecond engramctl spends
above this is engramctl's own overhead. `llama_cpp.Llama` is not used on purpose: its eval copies each
token's logits into its `scores` array and its sampler chain costs more than argmax, so it would be a
slower, more flattering reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from engramctl.errors import EngramError, UnsupportedModel


class RawLlama:
    def __init__(self, path: Path, *, n_ctx: int, n_batch: int, threads: int):
        import numpy as np

        from engramctl.engine.llama_context import ContextSize, context_params
        from engramctl.engine.llama_lib import import_llama_cpp, take_errors
        from engramctl.engine.llama_threadpool import ThreadPool

        lib = self._lib = import_llama_cpp()
        self._np = np
        self.n_batch, self.threads, self.n_ctx = n_batch, threads, n_ctx
        mparams = lib.llama_model_default_params()
        mparams.load_mode = lib.LLAMA_LOAD_MODE_MMAP  # as the backend loads it
        mparams.n_gpu_layers = 0
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        self._ctx = self._threadpool = None
        if not self._model:
            raise UnsupportedModel(f"raw llama.cpp could not load {Path(path).name}: {take_errors() or 'see the log'}")
        cparams = context_params(lib, ContextSize(n_ctx, sequences=1, kept_max=0), n_batch, threads)  # as the backend
        self._ctx = lib.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise UnsupportedModel(f"raw llama.cpp could not create a context: {take_errors() or 'see the log'}")
        self._threadpool = ThreadPool.attach(lib, self._ctx, threads)
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self._model)))
        self._one = (lib.llama_token * 1)()

    def settings(self) -> dict:
        """What llama.cpp says the context runs with (not what was asked for)."""
        lib = self._lib
        return {
            "n_ctx": int(lib.llama_n_ctx(self._ctx)),
            "n_batch": int(lib.llama_n_batch(self._ctx)),
            "n_ubatch": int(lib.llama_n_ubatch(self._ctx)),
            "threads": int(lib.llama_n_threads(self._ctx)),
            "threads_batch": int(lib.llama_n_threads_batch(self._ctx)),
            "flash_attn": True,
        }

    def chunks(self, ids: Sequence[int]) -> list:
        """`ids` as ctypes arrays of at most n_batch tokens, built before a timed prefill."""
        tok = self._lib.llama_token
        return [
            (tok * len(part))(*part) for part in (ids[i : i + self.n_batch] for i in range(0, len(ids), self.n_batch))
        ]

    def prefill(self, chunks: list) -> int:
        """Clear the sequence and feed the prepared chunks; returns the greedy next token."""
        lib = self._lib
        lib.llama_memory_clear(self._mem, False)  # as the backend does: metadata only
        for arr in chunks:
            self._decode(arr, len(arr))
        return self._argmax()

    def decode_greedy(self, token: int, n: int) -> int:
        """Feed `token`, then n-1 more tokens, each the argmax of the logits before it; returns the last argmax."""
        one = self._one
        for _ in range(n):
            one[0] = token
            self._decode(one, 1)
            token = self._argmax()
        return token

    def _decode(self, arr, n: int) -> None:
        rc = self._lib.llama_decode(self._ctx, self._lib.llama_batch_get_one(arr, n))
        if rc != 0:
            raise EngramError(f"raw llama.cpp could not run {n} tokens (status {rc}).")

    def _argmax(self) -> int:
        ptr = self._lib.llama_get_logits_ith(self._ctx, -1)
        return int(self._np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())

    def close(self) -> None:
        if self._ctx:
            self._lib.llama_free(self._ctx)
            self._ctx = None
        if self._threadpool is not None:  # after the context that ran on it
            self._threadpool.free()
            self._threadpool = None
        if self._model:
            self._lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "RawLlama":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
