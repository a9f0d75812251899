"""Test helper: a SessionState to and from a snapshot file, verified against the loaded model (the
product goes through the store; tests that need a bare file use this)."""

from __future__ import annotations

import time
from pathlib import Path

from engramctl.state.codec import from_payload, to_payload
from engramctl.state.session_state import SessionState
from engramctl.state.spec import StateSpec
from engramctl.store import snapshot_file


def state_metadata(session: str | None = None, parent: str | None = None, **extra: str) -> dict[str, str]:
    meta = {"created": f"{time.time():.6f}", **{k: str(v) for k, v in extra.items()}}
    if session:
        meta["session"] = session
    if parent:
        meta["parent"] = parent
    return meta


def write_state(path: Path, state: SessionState, spec: StateSpec, metadata: dict[str, str] | None = None) -> int:
    """Atomically write `state`; returns the file size in bytes."""
    tensors, meta = to_payload(state, spec, metadata or state_metadata())
    return snapshot_file.write(Path(path), tensors, meta)


def read_state(path: Path, spec: StateSpec) -> SessionState:
    """Read and fully verify a snapshot (checksum, format, dtype, fingerprint, shapes, finite values)
    before anything touches the model."""
    tensors, meta = snapshot_file.read(Path(path))
    return from_payload(tensors, meta, spec)
