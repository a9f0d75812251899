"""`snapshots export` / `snapshots import`: a snapshot as one standalone, verified file.

The exported file is a normal snapshot file (safetensors, checksummed) whose metadata also carries
the transcript the snapshot was taken at (`transcript`, JSON), so an import restores the conversation
as well as the state. Both directions verify checksum and format exactly like a restore does
(engramctl.store.snapshot_file.read); the model fingerprint is checked when the daemon loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engramctl.errors import EngramError, UsageError

TRANSCRIPT_KEY = "transcript"
_STORE_KEYS = ("checksum", "format", "format_version", "snapshot_id", "session", "parent", "created", TRANSCRIPT_KEY)


def export_snapshot(cat: Any, sid: str, dest: Path) -> dict:
    from engramctl.store import snapshot_file

    snap = cat.snapshot(sid)
    if not snap.get("durable", True):
        raise EngramError(f"snapshot {sid} is still being written to disk.", hint="try again in a moment")
    tensors, meta = snapshot_file.read(cat.snapshot_path(sid))  # verifies checksum and format
    messages = cat.snapshot_transcript(sid)
    meta = {k: v for k, v in meta.items() if k not in ("checksum", "format", "format_version")}
    meta[TRANSCRIPT_KEY] = json.dumps(messages, ensure_ascii=False, separators=(",", ":"))
    meta.setdefault("session", snap["session"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbytes = snapshot_file.write(dest, tensors, meta)
    return {"id": sid, "session": snap["session"], "file": str(dest.resolve()), "nbytes": nbytes,
            "n_tokens": snap["n_tokens"], "messages": len(messages)}  # fmt: skip


def read_export(file: Path) -> tuple[Any, list[dict], str | None]:
    """(payload, transcript, session recorded in the file); raises SnapshotCorrupt/SnapshotMismatch."""
    from engramctl.store import snapshot_file

    tensors, meta = snapshot_file.read(file)
    try:
        messages = json.loads(meta.get(TRANSCRIPT_KEY) or "[]")
    except ValueError:
        raise UsageError(f"{file.name}: its transcript metadata is not JSON.") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise UsageError(f"{file.name}: its transcript metadata is not a list of messages.")
    recorded = meta.get("session") or None
    clean = {k: v for k, v in meta.items() if k not in _STORE_KEYS}
    return (tensors, clean), messages, recorded


def import_snapshot(cat: Any, file: Path, session: str | None, label: str | None) -> dict:
    payload, messages, recorded = read_export(file)
    name = session or recorded
    if not name:
        raise UsageError(f"{file.name} does not record a session name.", hint="pass one: --session NAME")
    rec = cat.import_payload(name, payload, messages, label)
    return {**rec, "file": str(file.resolve()), "messages": len(messages)}
