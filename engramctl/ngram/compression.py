"""Tokenizer compression P: V -> V' (spec §2.2): tokens that differ only in case, accents, NFKC form or
surrounding whitespace share one canonical id, so their n-grams share table rows.

Built once, offline, from a tokenizer's per-token strings (taken as plain lists, so any tokenizer the
engine loads can supply them), and persisted as safetensors: every hash constant depends on V'.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from engramctl.errors import SnapshotCorrupt, UsageError

_FORMAT = "1"
_REPLACEMENT = "\ufffd"  # a decode that ends inside a UTF-8 sequence
_SENTINEL = "\ue000"  # private-use: lets a whitespace-only token survive the strip as " "


def demo_normalizer():
    """The demo's chain: NFKC, NFD, strip accents, lowercase, collapse whitespace, strip, with a sentinel
    so a whitespace-only token keeps the key " ". Built from HF `tokenizers` (installed with transformers)
    rather than unicodedata: its StripAccents drops every mark of its own Unicode tables (Mn, Mc and Me,
    not only Mn), its Lowercase ignores the final-sigma rule and its Strip another whitespace set, and
    each of those changes which tokens merge, hence V' and every hash constant."""
    from tokenizers import Regex, normalizers

    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), _SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(_SENTINEL, " "),
        ]
    )


def token_key(normalizer, decoded: str, raw: str | None = None) -> str:
    """The string a token is grouped by: its raw vocabulary string for a partial UTF-8 piece (which no
    normaliser can read), else the normalised text, else (normalised to nothing) the decoded text."""
    if _REPLACEMENT in decoded:
        return decoded if raw is None else raw
    return normalizer.normalize_str(decoded) or decoded


@dataclass(frozen=True)
class TokenMap:
    """token_map[raw id] = compressed id; `source` fingerprints the token strings it was built from."""

    token_map: np.ndarray  # (|V|,) int32
    compressed_vocab_size: int  # V'
    source: str

    def compress(self, ids, pad_id: int) -> np.ndarray:
        """Compressed ids (int64, same shape). Ids past the tokenizer (padded vocabulary slots of the
        model's embedding) map to the compressed pad id, the safe choice the spec recommends."""
        raw = np.asarray(ids, dtype=np.int64)
        if raw.size and raw.min() < 0:
            raise UsageError("token ids must be non-negative.")
        out = np.full(raw.shape, self.compressed_pad(pad_id), dtype=np.int64)
        inside = raw < len(self.token_map)
        out[inside] = self.token_map[raw[inside]]
        return out

    def compressed_pad(self, pad_id: int) -> int:
        if not 0 <= pad_id < len(self.token_map):
            raise UsageError(f"pad id {pad_id} is outside the tokenizer's {len(self.token_map)} tokens.")
        return int(self.token_map[pad_id])

    def save(self, path: Path) -> None:
        from safetensors.numpy import save_file

        meta = {"format": _FORMAT, "compressed_vocab_size": str(self.compressed_vocab_size), "source": self.source}
        save_file({"token_map": self.token_map}, str(path), metadata=meta)

    @classmethod
    def load(cls, path: Path) -> "TokenMap":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as f:
                meta = f.metadata() or {}
                token_map = f.get_tensor("token_map")
        except Exception as e:  # safetensors raises its own error types for a torn or foreign file
            raise SnapshotCorrupt(f"{path} is not a readable token map: {e}") from None
        if meta.get("format") != _FORMAT or token_map.dtype != np.int32 or token_map.ndim != 1:
            raise SnapshotCorrupt(f"{path} is not a format-{_FORMAT} token map (int32 vector).")
        size = int(meta.get("compressed_vocab_size", "-1"))
        if token_map.size and (token_map.min() < 0 or token_map.max() >= size):
            raise SnapshotCorrupt(f"{path} maps tokens outside its compressed vocabulary of {size}.")
        return cls(token_map=token_map, compressed_vocab_size=size, source=meta.get("source", ""))


def build_token_map(decoded: Sequence[str], raw: Sequence[str] | None = None) -> TokenMap:
    """decoded[t]: token t decoded alone with special tokens kept; raw[t]: its vocabulary string (used
    only for partial UTF-8 pieces). Compressed ids are given in first-seen order over ascending raw ids."""
    if raw is not None and len(raw) != len(decoded):
        raise UsageError(f"got {len(decoded)} decoded tokens but {len(raw)} raw vocabulary strings.")
    normalizer = demo_normalizer()
    ids: dict[str, int] = {}
    token_map = np.empty(len(decoded), dtype=np.int32)
    digest = hashlib.sha256()
    for t, text in enumerate(decoded):
        key = token_key(normalizer, text, None if raw is None else raw[t])
        token_map[t] = ids.setdefault(key, len(ids))
        extra = "" if raw is None else raw[t]
        digest.update(f"{len(text)}:{text}{len(extra)}:{extra}".encode("utf-8", "surrogatepass"))
    return TokenMap(token_map=token_map, compressed_vocab_size=len(ids), source=digest.hexdigest()[:16])


def build_from_decoder(
    n_tokens: int, decode_one: Callable[[int], str], raw_token: Callable[[int], str] | None = None
) -> TokenMap:
    """build_token_map from callables, e.g. `lambda t: tok.decode([t], skip_special=False)`."""
    decoded = [decode_one(t) for t in range(n_tokens)]
    raw = None if raw_token is None else [raw_token(t) for t in range(n_tokens)]
    return build_token_map(decoded, raw)


def identity_map(n_tokens: int) -> TokenMap:
    """No compression (V' = |V|): for random-id benchmarks, or a model whose tokenizer is not at hand."""
    return TokenMap(np.arange(n_tokens, dtype=np.int32), n_tokens, f"identity-{n_tokens}")
