"""ggml's CPU thread pool, made once for a context and kept for its life.

    pool = ThreadPool.attach(lib, ctx, threads)   # None where the library offers none (then ggml's default)
    pool.detach(); pool.reattach()                # ggml's per-graph pool meanwhile (tests, scripts/bench_threadpool.py)
    lib.llama_free(ctx); pool.free()             # after the context: it runs its graphs on the pool

Without an attached pool, ggml-cpu (built without OpenMP, as engramctl builds it: docs/llama-threads.md) makes a
"disposable" pool for every graph it computes: `ggml_graph_compute` starts threads - 1 new threads and joins
them at the end, once per llama_decode, so once per generated token. llama-server keeps one pool (common.cpp's
common_threadpools) or an OpenMP team for its life. What a kept pool saves is the start and join, ~0.05 ms a
decode on this 2-core VM: scripts/bench_threadpool.py (kept and per-graph alternated token by token, on a worker
thread) gave 0.333 against 0.382 ms a token on the tiny preset, 0.992-0.993x on SmolLM2 Q4_1 and 0.997x on the
350M preset; through the daemon, SmolLM2 streamed at 0.984x (greedy) and 0.986x (sampled) of a daemon without
it (docs/llama-threads.md). Same threads, same split of the work, so the same bits
(tests/engine/test_llama_threads.py).

`poll` 0: between graphs the pool's threads sleep on a condition variable instead of spinning (ggml's default,
50, busy-waits ~6.5M rounds after each graph): on 2 cores a spinning thread takes the core that the event loop
and the sampler need between tokens. Inside a graph ggml's barriers spin either way.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("engramctl.llama")

GGML_MAX_N_THREADS = 512  # ggml.h
GGML_BACKEND_DEVICE_TYPE_CPU = 0  # ggml-backend.h, enum ggml_backend_dev_type
POLL = 0


class _Params(ctypes.Structure):
    """struct ggml_threadpool_params (ggml.h)."""

    _fields_ = [
        ("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),  # all false: the inherited affinity
        ("n_threads", ctypes.c_int),
        ("prio", ctypes.c_int),  # enum ggml_sched_priority
        ("poll", ctypes.c_uint32),
        ("strict_cpu", ctypes.c_bool),
        ("paused", ctypes.c_bool),
    ]


class ThreadPool:
    def __init__(self, so, ctx, ptr: int, free_fn):
        self._so, self._ctx, self._ptr, self._free_fn = so, ctx, ptr, free_fn

    @classmethod
    def attach(cls, lib, ctx, threads: int) -> "ThreadPool | None":
        """A pool of `threads` (the context's n_threads and n_threads_batch) attached to `ctx`, or None where the
        CPU backend does not offer one (the context then keeps ggml's per-graph pool)."""
        try:
            so = lib.llama_cpp._lib  # libllama's handle: dlsym finds ggml's symbols through its dependencies
            so.ggml_backend_dev_by_type.restype = ctypes.c_void_p
            so.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
            so.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
            so.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
            so.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
            so.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
            so.ggml_threadpool_params_default.restype = _Params
            so.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
            so.llama_attach_threadpool.restype = None
            so.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            so.llama_detach_threadpool.restype = None
            so.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
        except AttributeError as e:
            log.debug("no ggml thread pool API in this llama.cpp (%s): a pool per graph", e)
            return None
        dev = so.ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
        reg = so.ggml_backend_dev_backend_reg(dev) if dev else None
        # looked up as llama.cpp's common.cpp does: through the CPU backend's registry, also where it is a plugin
        new = so.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_new") if reg else None
        free = so.ggml_backend_reg_get_proc_address(reg, b"ggml_threadpool_free") if reg else None
        if not new or not free:
            log.debug("the CPU backend offers no thread pool: a pool per graph")
            return None
        new_fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_Params))(new)
        free_fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(free)
        params = so.ggml_threadpool_params_default(threads)
        params.poll = POLL
        ptr = new_fn(ctypes.byref(params))
        if not ptr:
            log.warning("ggml could not start a thread pool of %d threads: a pool per graph", threads)
            return None
        pool = cls(so, ctx, ptr, free_fn)
        pool.reattach()
        return pool

    def reattach(self) -> None:
        self._so.llama_attach_threadpool(self._ctx, self._ptr, None)  # None: the batch pool is the same one

    def detach(self) -> None:
        """The context goes back to ggml's pool per graph (the pool itself stays, until free())."""
        self._so.llama_detach_threadpool(self._ctx)

    def free(self) -> None:
        """Stop and join the pool's threads; only once its context is freed (or detached)."""
        if self._ptr:
            ptr, self._ptr = self._ptr, None
            self._free_fn(ptr)
