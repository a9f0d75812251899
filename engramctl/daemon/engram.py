"""The Engram-compatible names, on the snapshot routes only (routes_snapshots.py).

The original Engram server answers `{"success": true, ...}`, and `{"success": false, "message": ...}` on
failure, and calls a session `conversation_id` (see the reference HTTP contract). Our own objects
(engramctl.protocol) use neither; this adapter adds them to what the snapshot routes send, and nothing
else does. Requests may say `conversation_id` for `session` (schemas.SessionRef accepts both).
"""

from __future__ import annotations

from typing import Any

from engramctl.protocol import Restored, Session, Snapshot

# The routes whose answers (and failures) carry the Engram names: the original five, and ours beside them.
ROUTES = frozenset({
    "/save_snapshot", "/restore_snapshot", "/list_snapshots", "/get_snapshot_info", "/delete_snapshot",
    "/branch_snapshot", "/pin_snapshot", "/unpin_snapshot", "/label_snapshot", "/get_snapshot_transcript",
    "/gc_snapshots", "/import_snapshot",
})  # fmt: skip


def ok(**fields: Any) -> dict[str, Any]:
    return {"success": True, **fields}


def snapshot(snap: Snapshot, **extra: Any) -> dict[str, Any]:
    return ok(**snap.to_json(), conversation_id=snap.session, **extra)


def snapshots(snaps: list[Snapshot]) -> dict[str, Any]:
    return ok(snapshots=[{**s.to_json(), "conversation_id": s.session} for s in snaps])


def session(s: Session, **extra: Any) -> dict[str, Any]:
    return ok(**extra, **s.to_json(), conversation_id=s.name)


def restored(r: Restored) -> dict[str, Any]:
    return ok(**r.to_json(), conversation_id=r.session)


def failure(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """An error body (protocol.ErrorBody's JSON), with `success: false` and `message` on these routes."""
    if path not in ROUTES:
        return body
    return {"success": False, "message": body["error"]["message"], **body}
