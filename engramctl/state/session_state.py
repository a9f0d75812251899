"""SessionState: everything needed to continue a conversation bit-for-bit."""

from __future__ import annotations

from dataclasses import dataclass

from engramctl.state.layers import LayerState
from engramctl.store import arrays
from engramctl.store.arrays import Array


@dataclass(frozen=True)
class SessionState:
    layers: tuple[LayerState, ...]  # one per decoder layer, in order, then one per N-gram layer
    token_ids: tuple[int, ...]  # every token the state has consumed
    last_logits: Array  # (vocab,) float32: logits after the last consumed token
    # Exact text the state consumed (prompt renders + generated text); lets the chat layer compute the
    # next turn's delta by string prefix, without re-tokenizing generated tokens.
    text: str = ""

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers) + arrays.nbytes(self.last_logits)

    @property
    def layout(self) -> tuple[str, ...]:
        return tuple(layer.kind for layer in self.layers)

    def to(self, device: str) -> "SessionState":
        return SessionState(
            layers=tuple(layer.to(device) for layer in self.layers),
            token_ids=self.token_ids,
            last_logits=arrays.to_device(self.last_logits, device),
            text=self.text,
        )
