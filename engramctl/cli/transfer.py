"""`snapshots export` / `snapshots import`: a snapshot as one standalone, verified file.

The file format is engramctl.store.exchange's (a normal snapshot file that also carries the transcript
the snapshot was taken at). Export is a read: the stored file (checksum and format verified) and the
snapshot's own transcript from the listing. Import is a change: the daemon verifies the file like a
restore (checksum, format, and the model fingerprint, dtype and layout against the loaded model) before
storing anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engramctl.errors import EngramError
from engramctl.protocol import Snapshot


def export_snapshot(listing: Any, ref: str, dest: Path) -> dict:
    from engramctl.store import exchange, snapshot_file
    from engramctl.store.files import read_payload

    snap = listing.snapshot(ref)
    sid = snap["id"]
    if not snap.get("durable", True):
        raise EngramError(f"snapshot {sid} is still being written to disk.", hint="try again in a moment")
    data_dir = listing.paths.data_dir  # verifies checksums and format; joins its KV blocks
    payload = read_payload(data_dir / "snapshots", data_dir / "blocks", sid)
    messages = listing.snapshot_transcript(sid)
    buf = exchange.pack(payload, messages, snap["session"])
    dest.parent.mkdir(parents=True, exist_ok=True)
    snapshot_file.write_atomic(dest, buf)
    return {
        "id": sid,
        "session": snap["session"],
        "file": str(dest.resolve()),
        "nbytes": len(buf),
        "n_tokens": snap["n_tokens"],
        "messages": len(messages),
    }


def import_snapshot(client: Any, file: Path, session: str | None, label: str | None) -> dict:
    """A new session from an export file (default name: the one recorded in the file)."""
    res = client.import_snapshot(file.read_bytes(), session=session, label=label)
    return {**Snapshot.from_json(res).to_dict(), "messages": res.get("messages"), "file": str(file.resolve())}
