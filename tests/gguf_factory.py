"""Tiny random-weight models (tests/factory.py) as GGUF files, converted with llama.cpp's own converter.

Converting pays torch/transformers imports in a child process (~5 s) plus ~1-3 s per model, so a
session converts each (family, seed, outtype) once, all missing ones in one child, under a directory
every test module of the session shares. The tokenizer is the offline byte-level BPE of
tests/factory.py, whose pre-tokenizer hash the converter cannot know: mapped to "gpt-2" (what
llama-cpp-notes.md measured working; only text splitting depends on it, not the state or the logits).
"""

from __future__ import annotations

from pathlib import Path

# GGUF architecture of each transformers family the llama.cpp backend serves (bamba -> granitehybrid).
LLAMA_FAMILIES: dict[str, str] = {
    "mamba2": "mamba2",
    "granitemoehybrid": "granitehybrid",
    "nemotron_h": "nemotron_h",
    "falcon_h1": "falcon-h1",
    "bamba": "granitehybrid",
    "jamba": "jamba",
    "lfm2": "lfm2",
    "qwen3_next": "qwen3next",
    "mamba": "mamba",
}
PRETOKENIZER = "gpt-2"


def needs_llama_cpp() -> str | None:
    """Why the llama.cpp tests cannot run here, or None."""
    import importlib.util

    from engramctl.engine.gguf_export import converter_dir
    from engramctl.errors import EngramError

    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (scripts/setup.sh builds it)"
    try:
        converter_dir()
    except EngramError as e:
        return e.message
    return None


class GgufZoo:
    """GGUF files of ModelZoo's model directories (tests/conftest.py), converted on first use."""

    def __init__(self, zoo, root: Path, eager=()):
        """`eager`: families converted along with the first one asked for (one converter process for all)."""
        self.zoo, self.root, self.eager = zoo, root, tuple(eager)
        root.mkdir(parents=True, exist_ok=True)

    def _out(self, family: str, seed: int, outtype: str) -> Path:
        return self.root / f"{family}-s{seed}.{outtype}.gguf"

    def ensure(self, families, seed: int = 0, outtype: str = "f32") -> None:
        """Convert every family of `families` not converted yet, in one converter process (one process of the run
        at a time: pytest-xdist's workers share the directory, and wait for what another converts)."""
        from engramctl.engine.gguf_export import export_many
        from tests.workers import one_at_a_time

        with one_at_a_time(self.root / ".lock"):
            jobs = [
                (self.zoo.path(f, seed), self._out(f, seed, outtype), outtype)
                for f in families
                if not self._out(f, seed, outtype).is_file()
            ]
            if jobs:
                export_many(jobs, pretokenizer_fallback=PRETOKENIZER)

    def path(self, family: str, seed: int = 0, outtype: str = "f32") -> Path:
        together = self.eager if (seed, outtype) == (0, "f32") and family in self.eager else ()
        self.ensure([family, *(f for f in together if f != family)], seed, outtype)
        return self._out(family, seed, outtype)
