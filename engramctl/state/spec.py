"""What a model's state must look like: the engine describes it, snapshots are checked against it."""

from __future__ import annotations

from dataclasses import dataclass

from engramctl.store.arrays import kind_of_backend

TOKENS = -1  # placeholder in a shape for "the number of tokens in the state"


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]  # TOKENS marks the dim that grows with the conversation
    dtype: str  # torch dtype name without "torch.", e.g. "float32"

    def shape_at(self, n_tokens: int) -> tuple[int, ...]:
        return tuple(n_tokens if d == TOKENS else d for d in self.shape)


@dataclass(frozen=True)
class LayerSpec:
    kind: str  # "empty" | "recurrent" | "attention" | "hybrid" | "ngram"
    tensors: dict[str, TensorSpec]


@dataclass(frozen=True)
class StateSpec:
    model_id: str
    fingerprint: str  # config + weights identity of the model that owns this state
    dtype: str  # compute dtype (transformers: "float32", ...) or the GGUF weight type (llama.cpp: "Q4_1", ...)
    vocab_size: int  # length of last_logits
    layers: tuple[LayerSpec, ...]
    backend: str = "transformers"  # which backend's state this is: "transformers" | "llama.cpp"
    # The backend's state-format version: a snapshot with another one is refused (llama.cpp: its
    # LLAMA_STATE_SEQ_VERSION and the parser's layout version). "" = transformers' own tensors.
    state_format: str = ""
    backend_version: str = ""  # library version that wrote it (llama-cpp-python 0.3.36): recorded, not compared

    @property
    def arrays(self) -> str:
        """The kind of this backend's state arrays: "numpy" (llama.cpp) or "torch" (store/arrays.py)."""
        return kind_of_backend(self.backend)

    @property
    def layout(self) -> tuple[str, ...]:
        return tuple(layer.kind for layer in self.layers)
