"""How the suite shares the machine between pytest-xdist's workers (pyproject.toml's addopts: -n 2 --dist loadfile).

    THREADS                          each worker's share of the cores (None outside pytest-xdist)
    share_cores()                    this process, and what it starts, computes on THREADS threads
    run_dir(tmp_path_factory, "zoo") a directory of the run that every worker shares
    with one_at_a_time(lock): ...    one process of the run at a time (what is built once per run)
    ModuleScheduling                 loadfile's scheduling: whole modules, TOGETHER groups, LONGEST_FIRST

A worker runs whole modules, so that a module-scoped daemon starts once; a daemon's test mostly waits on its
daemon's replies, so one pytest process keeps about one core busy, and two workers keep two. Each worker's models
then run on its share of the cores: two workers each running llama.cpp (and torch) on every core would run 4
compute threads on 2 cores, and ggml's threads spin at every barrier of a graph while their peer waits for a core.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path


def _threads() -> int | None:
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // int(workers))


# a worker's environment (PYTEST_XDIST_WORKER*) is inherited by the processes it starts: the same share there
THREADS = _threads()


def share_cores() -> None:
    """Under pytest-xdist, keep this process and the processes it starts to THREADS compute threads: torch's and
    the BLAS libraries' thread pools (their variables, read as they load: before torch is imported), the daemons
    (ENGRAM_THREADS: tests.daemon.conftest.daemon_env passes it on, the CLI's background daemon gets it from the
    settings) and the llama.cpp engines the tests build themselves (llama_backend's default: the cores it may use).
    Nothing outside pytest-xdist: a plain `pytest -n 0` runs as the product does."""
    if THREADS is None:
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ENGRAM_THREADS"):
        os.environ[var] = str(THREADS)
    import sys

    if "torch" in sys.modules:  # already loaded: its pool read the variables before they were set
        sys.modules["torch"].set_num_threads(THREADS)
    from engramctl.engine import llama_backend

    llama_backend.n_cpu_threads = lambda: THREADS


@contextmanager
def one_at_a_time(lock: Path):
    """Hold an exclusive lock on the file `lock`: one process of the run at a time (pytest-xdist's workers)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_dir(tmp_path_factory, name: str) -> Path:
    """A directory of this run that every pytest-xdist worker shares (the run's base temp dir, above each
    worker's own), so that what is built once per run is built once, not once per worker."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / name
    out.mkdir(exist_ok=True)
    return out


# The modules that share a session fixture too costly to make on both workers run on one, together.
TOGETHER = {
    "tests/engine/test_loading.py": "smol_converted",  # the SmolLM2 GGUF converted to safetensors (~30 s)
    "tests/engine/test_smollm2.py": "smol_converted",
}
# The modules of half a minute or more (--durations, two workers, on the 2-core development machine), longest
# first, so that no long one starts while the other worker runs out of work; the rest follow in collection order.
LONGEST_FIRST: tuple[str, ...] = tuple(
    f"tests/{m}.py"
    for m in (
        "daemon/test_tool_choice",
        "daemon/test_crash_anywhere",
        "daemon/test_scheduler",
        "daemon/test_engram_scenarios",
        "daemon/test_logprobs",
        "daemon/test_structured_output",
        "daemon/test_prefetch",
        "daemon/test_fuzz_api",
        "daemon/test_soak",
        "engine/test_loading",
        "engine/test_smollm2",
        "agent/test_rest",
        "daemon/test_concurrency",
        "engine/test_resume",
        "engine/test_llama_batch",
        "bench/test_bench_llama",
        "daemon/test_prefix_states",
        "daemon/test_live",
        "daemon/test_ollama",
        "cli/test_daemon_cli",
        "agent/test_ws",
        "daemon/test_restart",
        "daemon/test_backends",
        "engine/test_resume_ngram",
        "bench/test_bench_serve",
        "engine/test_llama_export",
        "daemon/test_full_disk",
        "daemon/test_engram_api",
        "daemon/test_sampling_domain",
        "daemon/test_security",
        "bench/test_bench",
    )
)


def module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def longest_first(items: list) -> None:
    """Sort the collected items (every worker collects the same, in the same order) module by module: the
    scheduler hands them out in that order."""
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: first.get(module(item.nodeid), len(first)))  # stable: a module stays whole


def module_scheduling(config, log):
    """loadfile's scheduling, a TOGETHER group being one module; the modules in the order the workers collected."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return TOGETHER.get(module(nodeid), module(nodeid))

    config.option.loadscopereorder = False  # keep the order the workers collected (LONGEST_FIRST)
    return ModuleScheduling(config, log)
