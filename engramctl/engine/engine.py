"""Engine: a backend plus its tokenizer. A chat turn on it is engine/turn.py's; the daemon and the
benchmark run turns, never these steps one by one."""

from __future__ import annotations

import threading
from typing import Sequence

import torch

from engramctl.engine.backend import Backend, Live
from engramctl.engine.chat import is_prefix_stable, turn_end_id
from engramctl.engine.generate import Generation
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import ContextOverflow
from engramctl.state import SessionState


class Engine:
    def __init__(self, backend: Backend, tokenizer: ChatTokenizer):
        self.backend = backend
        self.tokenizer = tokenizer
        self.info = backend.info
        self.spec = backend.spec
        self.prefix_stable = tokenizer.has_chat_template and is_prefix_stable(tokenizer)
        self.turn_end_id = turn_end_id(tokenizer) if self.prefix_stable else None
        self.notices: list[str] = []  # what loading it had to tell the user (e.g. a fallback model)

    def new_live(self) -> Live:
        return self.backend.new_live()

    def check_context(self, n_tokens: int) -> None:
        limit = self.info.context_length
        if limit is not None and n_tokens > limit:
            raise ContextOverflow(f"the conversation needs {n_tokens} tokens; the model's context is {limit} tokens.")

    def prefill(self, live: Live, token_ids: Sequence[int], cancel: threading.Event | None = None) -> torch.Tensor:
        """Feed tokens; the logits after the last one. Raises errors.Cancelled between chunks."""
        return self.backend.prefill(live, token_ids, cancel)

    def generate(self, live: Live, params: SamplingParams, cancel: threading.Event | None = None) -> Generation:
        return Generation(self.backend, self.tokenizer, live, params, cancel)

    def capture(self, live: Live) -> SessionState:
        return self.backend.capture(live)

    def inject(self, state: SessionState) -> Live:
        return self.backend.inject(state)

    def release(self, live: Live) -> None:
        """Free what `live` holds in the backend (a llama.cpp sequence, say); `live` is unusable after.
        Callers release a Live once nothing refers to it: never one still kept as a session's hot state."""
        self.backend.release(live)
