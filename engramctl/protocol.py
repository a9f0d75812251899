"""What crosses the wire between the daemon and its clients, defined once.

    Snapshot    one stored state (the snapshot routes, the agent tools, the CLI's snapshot rows)
    Session     a conversation: its head snapshot, branch point and transcript length
    Restored    the answer to a restore without a continuation: the state now loaded
    TurnInfo    a chat turn's `engram` extension: where its state came from and what it produced
    ErrorBody   the JSON body of every non-2xx answer
    same_model  whether a request's `model` names the model a daemon serves

The daemon writes these with `to_json`, the client side reads them with `from_json`: one definition of
the field names for both ends. The Engram-compatible extras (`success`, `message`, `conversation_id`,
that server's snapshot metadata and names: turn_number, branch_name, token_count, ...) are added by the
Engram routes' adapter (engramctl.daemon.engram_api) and nowhere else.

Stdlib only (no torch, httpx or pydantic): the CLI imports this for `--help`-fast commands.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any, Mapping


@cache
def _names(cls: type) -> tuple[str, ...]:
    """A dataclass's field names, in order (dataclasses.fields builds its tuple each call: a listing of 10,000
    snapshots crosses it twice a row)."""
    return tuple(f.name for f in fields(cls))


@cache
def _name_set(cls: type) -> frozenset[str]:
    return frozenset(_names(cls))


def _values(obj: Any, cls: type) -> dict[str, Any]:
    """`obj`'s values of `cls`'s fields, by name: shallow (asdict deep-copies every value: a listing of thousands
    spent most of its time there)."""
    return {name: getattr(obj, name) for name in _names(cls)}


def _known(cls: type, d: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `d` that are fields of `cls` (an answer may carry more: route extras, newer fields)."""
    names = _name_set(cls)
    return {k: v for k, v in d.items() if k in names}


@dataclass(frozen=True)
class Snapshot:
    """One snapshot. The fields are the store's record's (SnapshotRecord), so the store, the daemon and
    the CLI name them alike; only the wire spells three of them differently (`to_json`)."""

    id: str
    session: str  # the session that owns it
    parent: str | None
    n_tokens: int  # tokens the state has consumed
    nbytes: int  # once durable: its own file + every KV block it uses (what export writes); payload bytes before
    checksum: str | None
    fingerprint: str | None  # of the model that wrote it
    model_id: str | None
    n_messages: int  # transcript messages the state has consumed
    created: float
    last_access: float
    pinned: bool
    label: str | None
    durable: bool  # complete, fsynced and checksummed on disk
    tiers: tuple[str, ...] = ()  # where copies are now, hottest first
    file_bytes: int = 0  # its own file (the constant part when its KV is in blocks); payload bytes before durable
    own_size_bytes: int = 0  # what deleting it frees: its own file + the KV blocks only it uses
    shared_size_bytes: int = 0  # KV blocks it shares with other snapshots or prefix states
    kind: str = "snapshot"  # or "prefix": a prefix state (daemon/prefix_states.py)

    # On the wire (and in the agent tools' results) these three keep the names the first clients read.
    _WIRE = {"id": "snapshot_id", "n_tokens": "tokens", "nbytes": "bytes"}

    @property
    def tier(self) -> str | None:
        return self.tiers[0] if self.tiers else None

    @classmethod
    def from_record(cls, rec: Any) -> "Snapshot":
        """From a store.records.SnapshotRecord (same fields)."""
        return cls(**_values(rec, cls))

    def to_dict(self) -> dict[str, Any]:
        """The fields by their own names (what the CLI prints with --json), the tiers a list."""
        d = _values(self, type(self))
        d["tiers"] = list(self.tiers)
        return d

    def to_json(self) -> dict[str, Any]:
        return {
            "snapshot_id": self.id,
            "session": self.session,
            "parent": self.parent,
            "tokens": self.n_tokens,
            "bytes": self.nbytes,
            "tier": self.tier,
            "tiers": list(self.tiers),
            "created": self.created,
            "last_access": self.last_access,
            "pinned": self.pinned,
            "label": self.label,
            "durable": self.durable,
            "n_messages": self.n_messages,
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "checksum": self.checksum,
            "file_bytes": self.file_bytes,
            "own_size_bytes": self.own_size_bytes,
            "shared_size_bytes": self.shared_size_bytes,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Snapshot":
        own = {name: d[wire] for name, wire in cls._WIRE.items() if wire in d}
        rest = _known(cls, {k: v for k, v in d.items() if k not in cls._WIRE})
        return cls(**{**rest, **own, "tiers": tuple(d.get("tiers") or ())})


@dataclass(frozen=True)
class Session:
    """A conversation. The same fields as the store's SessionInfo, on the wire too."""

    name: str
    fingerprint: str | None  # of the model that produced the head
    model_id: str | None
    head: str | None  # the snapshot it continues from; None: re-prefilled from the transcript
    base: str | None  # the snapshot it was branched from, if it is a branch
    created: float
    last_used: float
    n_messages: int
    n_snapshots: int  # snapshots it owns
    stored_bytes: int = 0  # its snapshots' files and the KV blocks they use, each block once
    head_tokens: int = 0  # tokens in the head's state (0: no head)
    head_tiers: tuple[str, ...] = ()  # where the head is: a memory tier first, then disk

    @classmethod
    def from_info(cls, info: Any) -> "Session":
        """From a store.records.SessionInfo (same fields)."""
        return cls(**_values(info, cls))

    def to_json(self) -> dict[str, Any]:
        d = _values(self, type(self))
        d["head_tiers"] = list(self.head_tiers)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Session":
        known = _known(cls, d)
        known["head_tiers"] = tuple(known.get("head_tiers") or ())
        return cls(**known)


@dataclass(frozen=True)
class Restored:
    """A session's state, loaded and ready: the answer to a restore that generates nothing."""

    session: str
    snapshot_id: str | None  # the head it continues from (None: a session with no snapshot yet)
    tokens: int  # tokens in the state
    tier: str | None  # where it was loaded from: live (already in memory), vram, ram, disk
    restore_ms: float | None
    n_messages: int  # transcript length

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Restored":
        return cls(**_known(cls, d))


@dataclass(frozen=True)
class TurnInfo:
    """A chat turn's `engram` extension. The first streamed chunk carries the origin (session ..
    prefill_ms); the trailing one, after the finish chunk, adds the outcome (snapshot_id, finish_reason ..
    decode_ms)."""

    session: str | None = None
    resumed: bool = False  # the state was restored rather than computed from scratch
    restored_tokens: int = 0
    tier: str | None = None  # live | vram | ram | disk | None (computed); llama.cpp: vram = a parked device copy
    restore_ms: float | None = None  # a hot (live) state: what loading it back took, 0 when it stayed resident
    snapshot_id: str | None = None  # the reply's snapshot: the session's head after the turn
    snapshot_error: str | None = None  # why the turn has no snapshot (a full disk, say); the transcript has it
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    computed_tokens: int | None = None
    prefill_ms: float | None = None
    finish_reason: str | None = None  # stop | length | cancelled (OpenAI's own field says "length" for cancelled)
    completion_tokens: int | None = None
    ttft_ms: float | None = None
    decode_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "TurnInfo":
        return cls(**_known(cls, d or {}))


@dataclass(frozen=True)
class ErrorBody:
    """`{"error": {"message", "type", "code", "param", "hint"?}}`: OpenAI's shape plus a hint. `code` is the
    precise EngramError.kind (the client raises the same class), `type` OpenAI's coarse class."""

    message: str
    type: str
    code: str | None = None
    param: str | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.code, "param": self.param}
        if self.hint:
            err["hint"] = self.hint
        return {"error": err}

    @classmethod
    def from_json(cls, body: Any) -> "ErrorBody | None":
        """The error a body holds, or None when it is not one of these (a proxy's HTML page, say)."""
        err = body.get("error") if isinstance(body, Mapping) else None
        if not isinstance(err, Mapping):
            return None
        return cls(
            message=str(err.get("message") or ""),
            type=str(err.get("type") or ""),
            code=None if err.get("code") is None else str(err["code"]),
            param=err.get("param"),
            hint=err.get("hint"),
        )


def same_model(requested: str | None, *served: str | None) -> bool:
    """Whether `requested` (a request's or `--model`'s name) names the model served under any of `served`
    (its model id, the path it was loaded from): nothing or "default", the same name, the same last path
    component (a hub id and its local copy, a GGUF named by path or by file name), or the same file or
    directory. The one rule of the daemon's `model` check and the CLI's "is it already serving that?"."""
    names = [s for s in served if s]
    if not requested or requested == "default" or not names:
        return True
    for name in names:
        if requested == name or Path(requested).name == Path(name).name:
            return True
    try:
        wanted = Path(requested).expanduser()
        return wanted.exists() and any(wanted.resolve() == Path(name).expanduser().resolve() for name in names)
    except (OSError, ValueError, RuntimeError):  # no such path (a NUL byte, an unknown ~user): not ours
        return False
