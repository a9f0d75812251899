"""Engine: a backend plus its tokenizer, with the chat-level operations the daemon and bench use."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engramctl.engine.backend import Backend, Live
from engramctl.engine.chat import is_prefix_stable, plan_turn
from engramctl.engine.generate import Generation, settle
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import ContextOverflow
from engramctl.state import SessionState


@dataclass(frozen=True)
class Fed:
    prompt_tokens: int  # tokens the whole conversation takes (state + new)
    computed_tokens: int  # tokens actually run through the model this turn
    reset: bool  # the template was not prefix-stable here: the state started over


class Engine:
    def __init__(self, backend: Backend, tokenizer: ChatTokenizer):
        self.backend = backend
        self.tokenizer = tokenizer
        self.info = backend.info
        self.spec = backend.spec
        self.prefix_stable = tokenizer.has_chat_template and is_prefix_stable(tokenizer)
        self.notices: list[str] = []  # what loading it had to tell the user (e.g. a fallback model)

    def new_live(self) -> Live:
        return self.backend.new_live()

    def check_context(self, n_tokens: int) -> None:
        limit = self.info.context_length
        if limit is not None and n_tokens > limit:
            raise ContextOverflow(f"the conversation needs {n_tokens} tokens; the model's context is {limit} tokens.")

    def feed_messages(self, live: Live, messages: list[dict], reserve_tokens: int = 0) -> tuple[Live, Fed]:
        """Bring `live` up to `messages` + the generation prompt. Returns the live state to continue (a new
        one when the template forced a reset) and what it cost."""
        text, reset = plan_turn(self.tokenizer, live.text, messages, self.prefix_stable)
        if reset:
            live = self.new_live()
        ids = self.tokenizer.encode(text)
        self.check_context(len(live.token_ids) + len(ids) + reserve_tokens)
        if ids:
            self.backend.prefill(live, ids)
        live.text += text
        return live, Fed(prompt_tokens=len(live.token_ids), computed_tokens=len(ids), reset=reset)

    def generate(self, live: Live, params: SamplingParams, cancel: threading.Event | None = None) -> Generation:
        return Generation(self.backend, self.tokenizer, live, params, cancel)

    def settle(self, live: Live, generation: Generation) -> None:
        if generation.finish is not None:
            settle(self.backend, self.tokenizer, live, generation.finish)

    def capture(self, live: Live) -> SessionState:
        return self.backend.capture(live)

    def inject(self, state: SessionState) -> Live:
        return self.backend.inject(state)

