"""Engine: a backend plus its tokenizer. A chat turn on it is engine/turn.py's; the daemon's scheduler
steps several turns at once through `step`, the benchmark runs them alone."""

from __future__ import annotations

import threading
from typing import Sequence

from engramctl.engine.backend import Backend, Live
from engramctl.engine.chat import is_prefix_stable, turn_end_id
from engramctl.engine.generate import Generation
from engramctl.engine.sampling import SamplingParams
from engramctl.engine.tokenizer import ChatTokenizer
from engramctl.errors import ContextOverflow
from engramctl.state import SessionState
from engramctl.store.arrays import Array


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

    def check_text(self, text: str) -> None:
        """Refuse a text too long for the context whatever it tokenizes to, before tokenizing it: llama.cpp's
        tokenizer takes seconds on a text dense with special tokens (thousands of messages), on the worker."""
        limit = self.info.context_length
        n_bytes = len(text.encode())
        if limit is not None and n_bytes > 4 * limit and n_bytes > limit * self.tokenizer.max_token_bytes:
            raise ContextOverflow(
                f"the conversation needs more than {limit} tokens ({n_bytes} bytes of text); the model's context "
                f"is {limit} tokens."
            )

    def check_context(self, n_tokens: int) -> None:
        limit = self.info.context_length
        if limit is not None and n_tokens > limit:
            raise ContextOverflow(f"the conversation needs {n_tokens} tokens; the model's context is {limit} tokens.")

    @property
    def max_sequences(self) -> int:
        """How many conversations one `step` can run together (1: one at a time, as on transformers)."""
        return max(1, int(getattr(self.backend, "max_sequences", 1)))

    @property
    def step_tokens(self) -> int | None:
        """How many tokens one step feeds in all (the backend's chunk); None: no bound."""
        chunk = getattr(self.backend, "chunk_tokens", None)
        return None if chunk is None else max(1, int(chunk))

    @property
    def prompts_per_step(self) -> int | None:
        """How many prompt chunks one step feeds at most (None: any that fit). One with a KV stream per
        sequence: llama.cpp splits a step's tokens into ubatches of equal tokens per sequence, so prompts of
        unequal lengths in one step run as several smaller, slower ubatches (llama_streams.py)."""
        n = getattr(self.backend, "prompts_per_step", None)
        return None if n is None else max(1, int(n))

    @property
    def kv_layout(self) -> str | None:
        """How the backend lays out its conversations' KV cells, in words for `engramctl ps` (None: nothing to say)."""
        return getattr(self.backend, "kv_layout", None)

    @property
    def offload(self):
        """Which layers run on the GPU and why (tiers/offload.py OffloadPlan); None where the backend places the
        whole model on one device (transformers)."""
        return getattr(self.backend, "offload", None)

    @property
    def device_slots(self) -> int:
        """Parked conversations whose state the backend can keep a device copy of (llama.cpp's VRAM tier; 0
        elsewhere: the store's tiers hold the transformers backend's states)."""
        return int(getattr(self.backend, "device_slots", 0))

    def device_copies(self) -> dict | None:
        """The device copies' budget, use and rule (llama.cpp's VRAM tier); None where the backend keeps none."""
        report = getattr(self.backend, "device_copies", None)
        return report() if report is not None else None

    @property
    def vram_snapshots(self) -> bool:
        """Whether this backend's states can be held in the VRAM tier (llama.cpp's are host arrays: no)."""
        return bool(getattr(self.backend, "vram_snapshots", True))

    def gpu_memory(self) -> tuple[int, int, str] | None:
        """(free, total, name) of the GPU as the backend measures it, where torch does not (llama.cpp: ggml);
        None: the tier planner reads torch's figure as before."""
        measure = getattr(self.backend, "gpu_memory", None)
        return None if measure is None else measure()

    def prefill_chunk(self, live: Live, n_left: int, room: int | None = None) -> int:
        """How many of a prompt's `n_left` remaining tokens one step feeds: the backend's chunk, as its own
        prefill would cut them (a solo turn computes what it always did), or fewer when the step has only
        `room` left (the scheduler's budget); a Mamba1 state fed from empty takes them all, as its prefill
        does (one long scan is exact there)."""
        if self.info.resume == "token_by_token" and not live.token_ids:
            return n_left
        n = min(n_left, self.step_tokens or n_left)
        return n if room is None else min(n, room)

    def share_prefix(self, live: Live, token_ids: Sequence[int]) -> int:
        """Let `live`, holding nothing yet, start from the longest prefix of `token_ids` that another
        conversation in the backend holds (its cells shared, nothing computed); the tokens it now holds.
        0 on a backend that cannot (transformers; a model with recurrent state)."""
        share = getattr(self.backend, "share_prefix", None)
        return 0 if share is None else int(share(live, token_ids))

    def shareable_prefix(self, live: Live, token_ids: Sequence[int]) -> int:
        """The tokens share_prefix would give `live` now, nothing shared (0 where the backend cannot)."""
        shareable = getattr(self.backend, "shareable_prefix", None)
        return 0 if shareable is None else int(shareable(live, token_ids))

    def step(self, work: Sequence[tuple[Live, Sequence[int]]]) -> list[Array]:
        """Feed each Live its tokens (a prefill chunk, or one token) and return each one's last logits, in
        order: in one forward pass where the backend batches (`backend.step`), else one Live after another
        (a single token through `decode`, the same forward as a one-token prefill, as a solo reply feeds it)."""
        batched = getattr(self.backend, "step", None)
        if batched is not None:
            return list(batched(work))
        b = self.backend
        return [b.decode(live, tokens[0]) if len(tokens) == 1 else b.prefill(live, tokens) for live, tokens in work]

    def prefill(self, live: Live, token_ids: Sequence[int], cancel: threading.Event | None = None) -> Array:
        """Feed tokens; the logits after the last one. Raises errors.Cancelled between chunks."""
        return self.backend.prefill(live, token_ids, cancel)

    def generate(self, live: Live, params: SamplingParams, cancel: threading.Event | None = None) -> Generation:
        return Generation(self.backend, self.tokenizer, live, params, cancel)

    def capture(self, live: Live) -> SessionState:
        return self.backend.capture(live)

    def inject(self, state: SessionState) -> Live:
        return self.backend.inject(state)

    @property
    def place(self):
        """Where a snapshot read from disk puts its tensors (store/reader.py's Placer): the backend's own state
        layout, read into in place, so inject() copies nothing; None where the backend has none (transformers)."""
        return getattr(self.backend, "place_state", None)

    def take_load(self, live: Live) -> tuple[str, float] | None:
        """Where the backend loaded `live` back from since the last call, inside the steps that ran it, and the
        ms it took: ("device", ms) from a device copy (llama.cpp's VRAM tier), ("blob", ms) from host memory;
        None when it stayed resident (and on backends whose states never leave the model: transformers)."""
        take = getattr(self.backend, "take_load", None)
        return None if take is None else take(live)

    def release(self, live: Live) -> None:
        """Free what `live` holds in the backend (a llama.cpp sequence, say); `live` is unusable after.
        Callers release a Live once nothing refers to it: never one still kept as a session's hot state."""
        self.backend.release(live)
