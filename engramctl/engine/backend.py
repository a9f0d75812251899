"""The interface every inference backend implements. transformers is the first; a second (llama.cpp,
say) implements the same methods and the state/store/daemon layers do not change."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from engramctl.state import SessionState
from engramctl.state.spec import StateSpec
from engramctl.store.arrays import Array


@dataclass
class Live:
    """A conversation's state while it is in use. Only its backend reads `cache`."""

    cache: Any
    token_ids: list[int] = field(default_factory=list)  # consumed by the state, in order
    last_logits: Array | None = None  # (vocab,) float32 after the last consumed token
    text: str = ""  # the exact text the consumed tokens came from
    ngram: tuple = ()  # NgramState per N-gram layer (transformers with N-gram layers): conv windows, lookback


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    family: str  # transformers model_type, e.g. "granitemoehybrid"
    architecture: str  # e.g. "GraniteMoeHybridForCausalLM"
    device: str
    dtype: str
    n_params: int
    weights_bytes: int
    context_length: int | None  # max positions the model was built for; None = unbounded (pure recurrent)
    fingerprint: str
    resume: str  # "chunked" | "token_by_token" (Mamba1 scans ignore an initial state for >1 token)
    backend: str = "transformers"  # "transformers" | "llama.cpp"
    weight_type: str = ""  # how the weights are held: "float32", "bfloat16", "Q4_1", "Q8_0", "F16", ...
    build: str = ""  # what computes: "CPU (AVX2 ...)", "CUDA sm_89 on <GPU>; CPU (...)", "torch 2.13.0, CPU"


class Backend(Protocol):
    info: ModelInfo
    spec: StateSpec
    max_sequences: int  # how many Lives can be stepped together; 1 = one at a time (transformers)
    chunk_tokens: int  # the most tokens one forward pass takes, all Lives of a step together

    def new_live(self) -> Live: ...

    def prefill(self, live: Live, token_ids: Sequence[int], cancel: threading.Event | None = None) -> Array:
        """Feed tokens into the state; returns the logits after the last one, (vocab,) float32.
        Raises errors.Cancelled, between chunks, once `cancel` is set."""

    def decode(self, live: Live, token_id: int) -> Array: ...

    def step(self, work: Sequence[tuple[Live, Sequence[int]]]) -> list[Array]:
        """Feed each Live its tokens (>= 1: a decode is one token, a prefill chunk up to chunk_tokens), in one
        forward pass where the backend can; return each Live's last logits ((vocab,) float32), in order.
        The Lives are distinct. A Live not in `work` may be parked by the backend to make room.
        Optional: a backend without it (transformers) is fed one Live at a time through prefill/decode."""

    def capture(self, live: Live) -> SessionState: ...

    def inject(self, state: SessionState) -> Live: ...

    def release(self, live: Live) -> None:
        """Free what `live` holds inside the backend (a llama.cpp sequence, say). `live` is unusable after."""
