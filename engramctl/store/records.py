"""What the store hands out: immutable records of sessions and snapshots, and the payload type.

A payload is `(tensors, metadata)`: the flat tensor dict and string metadata of one snapshot file
(see snapshot_file). By convention it holds tensor "token_ids" (int64, shape (n,)) and metadata
"n_tokens", "fingerprint", "model_id", "dtype", "text". The store never interprets the rest.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from engramctl.errors import UsageError
from engramctl.store import arrays
from engramctl.store.arrays import Array

Payload = tuple[dict[str, Array], dict[str, str]]  # numpy arrays or torch tensors (store/arrays.py)
TOKEN_IDS = "token_ids"


def payload_nbytes(payload: Payload) -> int:
    """Bytes the payload's tensors occupy in memory (what the RAM/VRAM tiers account)."""
    return sum(arrays.nbytes(t) for t in payload[0].values())


def payload_to(payload: Payload, device: str) -> Payload:
    """The same payload with every tensor on `device` (no copy for tensors already there)."""
    tensors, meta = payload
    return {k: arrays.to_device(t, device) for k, t in tensors.items()}, meta


def check_payload(payload: Any) -> tuple[list[int] | None, int]:
    """Validate the payload's shape; return (token ids or None, n_tokens)."""
    if not (isinstance(payload, tuple) and len(payload) == 2):
        raise UsageError("a snapshot payload is a (tensors, metadata) pair.")
    tensors, meta = payload
    if not isinstance(tensors, dict) or not all(isinstance(k, str) and arrays.is_array(v) for k, v in tensors.items()):
        raise UsageError("payload tensors must be a dict of name -> numpy array or torch.Tensor.")
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise UsageError("payload metadata must be a dict of str -> str.")
    ids_t = tensors.get(TOKEN_IDS)
    if ids_t is None:
        try:
            return None, int(meta.get("n_tokens", "0"))
        except ValueError:
            raise UsageError(f"payload metadata n_tokens={meta.get('n_tokens')!r} is not an integer.") from None
    if arrays.dtype_name(ids_t) != "int64" or len(arrays.shape(ids_t)) != 1:
        raise UsageError(
            f"payload token_ids must be a 1-D int64 tensor, not {arrays.dtype_name(ids_t)}{list(arrays.shape(ids_t))}."
        )
    ids = ids_t.tolist()
    if "n_tokens" in meta and meta["n_tokens"] != str(len(ids)):
        raise UsageError(f"payload says n_tokens={meta['n_tokens']} but holds {len(ids)} token ids.")
    return ids, len(ids)


@dataclass(frozen=True)
class SessionInfo:
    name: str
    fingerprint: str | None  # of the model that produced the head (None before the first commit)
    model_id: str | None
    head: str | None  # snapshot to resume from; None = resume by re-prefilling the transcript
    base: str | None  # snapshot this session was branched from, if it is a branch
    created: float
    last_used: float
    n_messages: int  # transcript length
    n_snapshots: int  # snapshots this session owns
    stored_bytes: int = 0  # its snapshots' files and the KV blocks they use, each block once
    head_tokens: int = 0  # tokens in the head's state (0: no head)
    head_tiers: tuple[str, ...] = ()  # where the head is: a memory tier first, then disk (SnapshotRecord.tiers)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["head_tiers"] = list(self.head_tiers)
        return d


@dataclass(frozen=True)
class SnapshotRecord:
    id: str
    session: str  # owning session (moves to a surviving branch when the owner is deleted)
    parent: str | None
    n_tokens: int
    nbytes: int  # once durable: its own file + every KV block it uses (what `export` writes); payload bytes before
    checksum: str | None  # its own file header's payload checksum, "xxh3_128:<hex>" (set when durable)
    fingerprint: str | None
    model_id: str | None
    n_messages: int  # transcript messages this state has consumed: transcript[:n_messages]
    created: float
    last_access: float
    pinned: bool
    label: str | None
    durable: bool  # the file is complete, fsynced and checksummed on disk
    tiers: tuple[str, ...] = ()  # where copies are now, hottest first, e.g. ("ram", "disk")
    file_bytes: int = 0  # its own file (the constant part when its KV is in blocks); payload bytes before durable
    own_size_bytes: int = 0  # what deleting it frees: its own file + the KV blocks no other snapshot uses
    shared_size_bytes: int = 0  # the KV blocks it shares with other snapshots or prefix states
    kind: str = "snapshot"  # or "prefix": a prefix state (store/prefixes.py)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tiers"] = list(self.tiers)
        return d


@dataclass
class GcReport:
    deleted: dict[str, str] = field(default_factory=dict)  # snapshot id -> reason
    freed_bytes: int = 0
    messages_removed: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ReconcileReport:
    temp_files_removed: list[str] = field(default_factory=list)
    quarantined: dict[str, str] = field(default_factory=dict)  # file name -> reason
    rows_dropped: dict[str, str] = field(default_factory=dict)  # snapshot id -> reason
    made_durable: list[str] = field(default_factory=list)  # written files whose row had not caught up
    blocks_removed: list[str] = field(default_factory=list)  # KV block files no snapshot uses (or half written)

    @property
    def clean(self) -> bool:
        return not (
            self.temp_files_removed or self.quarantined or self.rows_dropped or self.made_durable or self.blocks_removed
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        """One line of counts, and the commonest reason a row was dropped: the whole report (at thousands of rows,
        a megabyte of JSON) is not for a terminal or a log line."""
        parts = [
            f"{_count(n, what)} {done}"
            for n, what, done in (
                (len(self.rows_dropped), "snapshot", "dropped"),
                (len(self.quarantined), "file", "quarantined"),
                (len(self.blocks_removed), "KV block file", "removed"),
                (len(self.temp_files_removed), "temp file", "removed"),
                (len(self.made_durable), "snapshot", "adopted"),
            )
            if n
        ]
        if self.rows_dropped:
            reasons = Counter(self.rows_dropped.values()).most_common()
            reason, n = reasons[0]
            others = f", {_count(len(reasons) - 1, 'other reason')}" if len(reasons) > 1 else ""
            parts.append(f"commonest reason ({n:,} dropped): {reason}{others}")
        return "; ".join(parts) or "nothing to do"


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
