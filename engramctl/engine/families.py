"""Which transformers families resume exactly, and how.

Each entry was checked by tests/engine/test_resume.py: restore in a fresh process, continue, and
compare with an uninterrupted prefill. A recurrent family not listed here is refused, never served
silently wrong. Plain attention models (every cache layer full attention) need no entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from engramctl.errors import UnsupportedModel


@dataclass(frozen=True)
class Family:
    model_type: str
    # Mamba1 scans (torch fallback and mamba-ssm's selective_scan_fn) start every multi-token scan from
    # a zero SSM state, so a non-empty state may only be continued one token per forward.
    token_by_token: bool = False
    # Class name of the Mamba2 mixer whose PyTorch chunked scan pads every input to `chunk_size`;
    # the backend fits that chunk to each input (engine/scan_chunk.py). None: no such scan.
    scan_mixer: str | None = None


RECURRENT_FAMILIES: dict[str, Family] = {
    f.model_type: f
    for f in (
        Family("mamba2", scan_mixer="Mamba2Mixer"),
        Family("granitemoehybrid", scan_mixer="GraniteMoeHybridMambaLayer"),  # IBM Granite 4.0-H
        Family("nemotron_h", scan_mixer="NemotronHMamba2Mixer"),
        Family("falcon_h1", scan_mixer="FalconH1Mixer"),
        # needs explicit position_ids on continuation; the backend always passes them
        Family("bamba", scan_mixer="BambaMixer"),
        Family("zamba2", scan_mixer="Zamba2MambaMixer"),
        # gated delta net: its torch scan pads to a fixed 64 (a function default, not a module attribute)
        Family("qwen3_next"),
        Family("lfm2"),
        Family("jamba", token_by_token=True),
        Family("mamba", token_by_token=True),
        Family("falcon_mamba", token_by_token=True),
    )
}


def family_for(model_type: str, layer_classes: list[str]) -> Family:
    """Decide from the model type and the cache layer classes a fresh cache builds."""
    recurrent = any("LinearAttention" in c for c in layer_classes)
    if any("Sliding" in c or "Chunked" in c for c in layer_classes):
        raise UnsupportedModel(
            f"model type {model_type!r} uses sliding-window attention, whose cache drops old tokens; "
            "engramctl cannot snapshot it exactly yet."
        )
    if recurrent:
        if model_type not in RECURRENT_FAMILIES:
            raise UnsupportedModel(
                f"model type {model_type!r} has recurrent layers but is not verified to resume exactly; "
                f"supported recurrent families: {', '.join(sorted(RECURRENT_FAMILIES))}."
            )
        return RECURRENT_FAMILIES[model_type]
    unknown = [c for c in layer_classes if c not in ("DynamicLayer", "DummyLayer")]
    if unknown:
        raise UnsupportedModel(
            f"model type {model_type!r} uses cache layers {sorted(set(unknown))} that engramctl does not know."
        )
    return Family(model_type)
