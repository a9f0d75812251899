"""The export file of `snapshots export` / `import`: one standalone snapshot with its conversation.

It is a normal snapshot file (safetensors, checksummed; see snapshot_file), whole (its KV joined from the
store's blocks, files.read_payload; an import splits it into blocks again), whose metadata also
carries the transcript the snapshot was taken at (`transcript`, JSON) and the session it came from,
so an import restores the conversation as well as the state. Reading one verifies checksum and
format exactly like a restore does; whether the state fits the loaded model is the daemon's check.
"""

from __future__ import annotations

import json
from typing import Any

from engramctl.errors import UsageError
from engramctl.store import snapshot_file
from engramctl.store.blocks import KV_BLOCKS
from engramctl.store.records import Payload

TRANSCRIPT_KEY = "transcript"
# what the store writes into every snapshot file itself; an import gets fresh ones
_STORE_KEYS = (
    "checksum",
    "format",
    "format_version",
    "snapshot_id",
    "session",
    "parent",
    "created",
    TRANSCRIPT_KEY,
    KV_BLOCKS,
)


def pack(payload: Payload, messages: list[dict], session: str | None) -> bytes:
    """The bytes of an export file for a stored snapshot's payload and its transcript."""
    tensors, meta = payload
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version", KV_BLOCKS)}
    meta[TRANSCRIPT_KEY] = json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    if session and not meta.get("session"):
        meta["session"] = session
    return snapshot_file.encode(tensors, meta)


def unpack(buf: bytes, source: str = "the snapshot file") -> tuple[Payload, list[dict], str | None]:
    """(payload ready to commit, transcript, session recorded in the file). Raises SnapshotCorrupt /
    SnapshotMismatch (checksum, format) or UsageError (a transcript that is not a list of messages)."""
    tensors, meta = snapshot_file.decode(buf, source=source)
    try:
        messages: Any = json.loads(meta.get(TRANSCRIPT_KEY) or "[]")
    except ValueError:
        raise UsageError(f"{source}: its transcript metadata is not JSON.") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise UsageError(f"{source}: its transcript metadata is not a list of messages.")
    recorded = meta.get("session") or None
    clean = {k: v for k, v in meta.items() if k not in _STORE_KEYS}
    return (tensors, clean), messages, recorded
