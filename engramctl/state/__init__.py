"""Backend-neutral conversation state: typed per-layer tensors, token ids and last logits."""

from engramctl.state.layers import AttentionState, EmptyState, HybridState, LayerState, NgramState, RecurrentState
from engramctl.state.session_state import SessionState

__all__ = ["AttentionState", "EmptyState", "HybridState", "LayerState", "NgramState", "RecurrentState", "SessionState"]
