"""The one place llama_cpp (llama-cpp-python) is imported: lazily, with a typed error when it is missing,
and with llama.cpp's own log routed to Python logging (it prints every load detail to stderr otherwise)."""

from __future__ import annotations

import collections
import ctypes
import logging
import os

from engramctl.errors import BackendUnavailable

log = logging.getLogger("engramctl.llama")
PINNED_VERSION = "0.3.36"
_INSTALL_HINT = (
    'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF" '
    f".venv/bin/pip install llama-cpp-python=={PINNED_VERSION} "
    "(or rerun scripts/setup.sh); the first build takes ~10 minutes on 2 cores"
)
# ggml_log_level (ggml.h: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5) -> logging; its INFO is load detail, kept at DEBUG
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_state: dict = {}


def import_llama_cpp():
    """llama_cpp with its backend initialised and its log captured, or BackendUnavailable."""
    if "lib" in _state:
        return _state["lib"]
    try:
        import llama_cpp
    except ImportError as e:
        raise BackendUnavailable(
            f"the llama.cpp backend needs llama-cpp-python, which is not installed ({e}).", hint=_INSTALL_HINT
        ) from None
    except (OSError, RuntimeError) as e:  # the library is there but cannot be loaded (CPU flags, missing libgomp)
        raise BackendUnavailable(
            f"llama-cpp-python is installed but its library cannot be loaded: {e}", hint=_INSTALL_HINT
        ) from None

    # before any model or kernel runs: a build for another CPU refuses here instead of dying of SIGILL later
    from engramctl.engine.cpu_features import check, machine_flags
    from engramctl.engine.llama_build import compiled_cpu_features

    check(compiled_cpu_features(llama_cpp.llama_print_system_info().decode("utf-8", "replace")), machine_flags())

    last = [logging.DEBUG]

    @llama_cpp.llama_log_callback
    def _on_log(level: int, text: bytes, _user) -> None:
        lvl = last[0] if level == 5 else _LEVELS.get(level, logging.DEBUG)  # 5 continues the previous line
        last[0] = lvl
        line = text.decode("utf-8", "replace").rstrip()
        if lvl >= logging.ERROR and line:
            _recent_errors.append(line)
        if line and log.isEnabledFor(lvl):
            log.log(lvl, "%s", line)

    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    _state["callback"] = _on_log  # ctypes keeps only a raw pointer: the Python object must outlive every call
    _state["lib"] = llama_cpp
    return llama_cpp


OPENMP_NOTICE = (
    "llama-cpp-python was built with OpenMP: the daemon decodes on its worker thread, where an OpenMP build runs "
    "~1.8x slower than on the thread that loaded the model (docs/llama-threads.md). Rebuild it without: "
    'CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DGGML_OPENMP=OFF" pip install --force-reinstall --no-cache-dir '
    f"llama-cpp-python=={PINNED_VERSION} (or rerun scripts/setup.sh)"
)


def openmp_linked() -> bool:
    """Whether the loaded llama.cpp runs its graphs with an OpenMP team (ggml-cpu's features say OPENMP = 1).
    Not whether libgomp is in the process: torch maps it too."""
    return "OPENMP = 1" in import_llama_cpp().llama_print_system_info().decode("utf-8", "replace")


def take_errors() -> str:
    """What llama.cpp logged at error level since the last call, for the message of a typed error."""
    lines = list(_recent_errors)
    _recent_errors.clear()
    return "; ".join(lines)


def n_cpu_threads() -> int:
    """Threads = cores this process may run on (llama-cpp-notes.md: prefill and decode scale with them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama_cpp_python")
    except PackageNotFoundError:
        return import_llama_cpp().__version__
