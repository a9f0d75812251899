"""Raw prompts as the engine takes them: token ids and the text they encode, checked against the model's
vocabulary. /v1/completions and Ollama's /api/generate build their turns here (on the worker thread:
tokenizing a long prompt is work); the chat routes render messages with the chat template instead.
"""

from __future__ import annotations

from typing import Sequence

from engramctl.daemon.service import CompletionRequest
from engramctl.engine.engine import Engine
from engramctl.engine.fim import infill_ids
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import UsageError


def vocab_size(engine: Engine) -> int | None:
    """How many token ids the tokenizer knows (None: it cannot say)."""
    tok = engine.tokenizer
    n = getattr(tok, "n_vocab", None)
    if n is None and getattr(tok, "hf", None) is not None:
        n = len(tok.hf)
    return None if n is None else int(n)


def check_ids(engine: Engine, ids: Sequence[int], field: str) -> None:
    """Every id is one the model knows; else a UsageError naming `field`."""
    n = vocab_size(engine)
    bad = next((t for t in ids if t < 0 or (n is not None and t >= n)), None)
    if bad is not None:
        raise UsageError(f"{field}: token id {bad} is not in the model's vocabulary (0-{(n or 1) - 1}).")


def check_params(engine: Engine, params: SamplingParams) -> None:
    check_ids(engine, [token for token, _ in params.logit_bias], "logit_bias")


def completion(
    engine: Engine, prompt: str | list[int], params: SamplingParams, suffix: str | None = None
) -> CompletionRequest:
    """A text completion's turn: the prompt as given (text, or token ids), or with a suffix the
    fill-in-the-middle prompt around both. The route has checked `params` (check_params)."""
    tok = engine.tokenizer
    if isinstance(prompt, str):
        engine.check_text(prompt)
        ids = tok.encode(prompt)
    else:
        check_ids(engine, prompt, "prompt")
        ids = list(prompt)
    if suffix is not None:
        ids = infill_ids(tok, ids, suffix)
    if not ids:
        raise UsageError("prompt: it is empty; give at least one token to complete.")
    return CompletionRequest(ids, tok.decode(ids, skip_special=False), params)
