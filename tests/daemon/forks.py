"""Daemons forked from a server that imported what a daemon imports (tests/children.py), one server per pytest process
and kind, started at its first daemon: a transformers daemon spent ~6 of its ~8 s of CPU to ready importing torch,
transformers' model code, fastapi and uvicorn.

Two kinds, so that a forked daemon holds only what a fresh one would import before its first request: a GGUF's
daemon (llama.cpp) never imports torch (test_llama_no_torch), and torch in sys.modules changes what it does
(engine/loading.py sets torch's threads, tiers/hardware.py asks torch for a GPU), so its server has not imported it.

    child = fork_daemon(model, args, env, log, cwd)    a daemon as `python -m engramctl.daemon <args>`: a Child

Only in a pytest session (tests/conftest.py sets `enabled`): scripts/ that start daemons through tests.daemon.harness
time them and count their CPU as their own children's, so theirs stay fresh interpreters.
"""

from __future__ import annotations

import atexit
from pathlib import Path

from tests.children import Child, Children

# the daemon's runner, its app with its routes, and what uvicorn imports as it starts serving (not the daemon's
# __main__: runpy warns of a __main__ imported before it runs it)
SERVING = (
    "engramctl.daemon.runner",
    "engramctl.daemon.app",
    "engramctl.engine.loading",
    "uvicorn.main",
    "uvicorn.lifespan.on",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
)
PRELOAD = {
    "transformers": (
        *SERVING,
        "engramctl.engine.hf_backend",
        "transformers.models.granitemoehybrid.modeling_granitemoehybrid",
        "transformers.models.auto.modeling_auto",
        "transformers.models.auto.tokenization_auto",
        "accelerate",
    ),
    # llama_cpp imported only: the daemon initialises its backend (engine/llama_lib.py) after the fork; not
    # llama_backend, whose llama_buffers starts the buffer preparer's thread as it loads (~0.1 s left to the daemon)
    "llama.cpp": (*SERVING, "llama_cpp", "engramctl.engine.llama_lib", "engramctl.engine.llama_pool"),
}
ABSENT = {"transformers": (), "llama.cpp": ("torch", "transformers")}
_servers: dict[str, Children] = {}
enabled = False


def kind_of(model: Path) -> str:
    return "llama.cpp" if Path(model).suffix == ".gguf" else "transformers"


def fork_daemon(model: Path, args: list[str], env: dict[str, str], log: Path, cwd: Path) -> Child:
    """`python -m engramctl.daemon <args>` serving `model`, forked: stdout and stderr into `log`. The server starts in
    `env` (the first daemon's: what its imports read as they load, OMP_NUM_THREADS for one, is every daemon's)."""
    kind = kind_of(model)
    if kind not in _servers:
        # armed crash points are read as crashpoints loads: each daemon reads its own
        _servers[kind] = Children(
            PRELOAD[kind], reread=("engramctl.store.crashpoints",), env=env, absent=ABSENT[kind]
        ).open()
        if len(_servers) == 1:
            atexit.register(_close)
    return _servers[kind].start(args, env, stdout=log, module="engramctl.daemon", cwd=cwd)


def _close() -> None:
    for server in _servers.values():
        server.close()
