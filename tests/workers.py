"""How the suite shares the machine between pytest-xdist's workers (pyproject.toml's addopts: -n 2 --dist loadfile).

    THREADS                          each worker's share of the cores (None outside pytest-xdist)
    share_cores()                    the processes this one starts, and its torch, compute on THREADS threads
    with llama_threads(THREADS): ... the llama.cpp engines this process builds meanwhile default to that many
    run_dir(tmp_path_factory, "zoo") a directory of the run that every worker shares
    with one_at_a_time(lock): ...    one process of the run at a time (what is built once per run)
    module_scheduling(config, log)   loadfile's scheduling: whole modules, TOGETHER groups, LONGEST_FIRST

A worker runs whole modules, so that a module-scoped daemon starts once; a daemon's test mostly waits on its
daemon's replies, so one pytest process keeps about one core busy, and two workers keep two. Each worker's models
then compute on its share of the cores: two workers each running llama.cpp on both cores put 4 compute threads
on 2, whose barriers spin while a peer waits for a core (a whole run: 1,731 s of CPU against 1,399 s).

Except the engine's own tests (tests/engine/conftest.py): llama.cpp's bits depend on its thread count. On one
thread a conversation's lone step beside another's resident cells gives the very bits it gives alone
(test_llama_batch's test_a_resident_neighbour_would_change_a_lone_step_so_it_is_parked fails there), so the tests
that hold llama.cpp's batching to bitwise agreement run it as the product does, on every core.
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
    """Under pytest-xdist, keep torch's and the BLAS libraries' thread pools (their variables, read as they load:
    before torch is imported), here and in the processes this one starts, and the daemons it starts (ENGRAM_THREADS:
    tests.daemon.conftest.daemon_env passes it on, the CLI's background daemon has it from the settings) to THREADS.
    Nothing outside pytest-xdist: a plain `pytest -n 0` runs as the product does."""
    if THREADS is None:
        return
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "ENGRAM_THREADS"):
        os.environ[var] = str(THREADS)
    import sys

    if "torch" in sys.modules:  # already loaded: its pool read the variables before they were set
        sys.modules["torch"].set_num_threads(THREADS)


@contextmanager
def llama_threads(threads: int | None):
    """Meanwhile, a llama.cpp engine built in this process without `threads` runs on `threads` (None: on every
    core this process may use, the product's default)."""
    from engramctl.engine import llama_backend, llama_lib

    before = llama_backend.n_cpu_threads
    llama_backend.n_cpu_threads = llama_lib.n_cpu_threads if threads is None else (lambda: threads)
    try:
        yield
    finally:
        llama_backend.n_cpu_threads = before


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
# The modules of half a minute or more (junit times, two workers, on the 2-core development machine), longest first,
# so that no long one starts while the other worker runs out of work; the rest follow in collection order.
LONGEST_FIRST: tuple[str, ...] = tuple(
    f"tests/{m}.py"
    for m in (
        "daemon/test_tool_choice",
        "daemon/test_crash_anywhere",
        "daemon/test_scheduler",
        "engine/test_loading",  # with engine/test_smollm2 (TOGETHER)
        "engine/test_smollm2",
        "cli/test_daemon_cli",
        "daemon/test_prefetch",
        "daemon/test_soak",
        "daemon/test_engram_scenarios",
        "daemon/test_fuzz_api",
        "daemon/test_structured_output",
        "bench/test_bench_serve",
        "daemon/test_concurrency",
        "daemon/test_restart",
        "engine/test_resume",
        "engine/test_llama_streams",
        "daemon/test_security",
        "daemon/test_prefix_states",
        "engine/test_llama_batch",
        "bench/test_bench_llama",
        "daemon/test_logprobs",
        "daemon/test_engram_api",
        "engine/test_llama_export",
        "cli/test_snapshots",
        "daemon/test_live",
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
