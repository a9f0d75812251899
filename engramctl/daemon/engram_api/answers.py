"""The Engram API's answer fields, on its routes only (routes.py).

The original Engram server answers `{"success": true, ...}`, and `{"success": false, "message": ...}` on
failure, and calls a session `conversation_id` (see the reference HTTP contract and docs/engram-api.md).
Our own objects (engramctl.protocol) use neither; this adapter adds them to what the snapshot routes send,
and nothing else does. Requests may say `conversation_id` for `session` (engram_api/schemas.py SessionRef accepts both).

Its snapshot metadata (`Meta`: turn_number, branch_name, timestamp, token_count, model_name, ...) goes on
every snapshot these routes describe, beside our own fields; `name` is the snapshot's id in their terms
("<conversation_id>-t<turn>" or the custom id a save gave it) and `id` our unique id, which stays the
`snapshot_id` everywhere except in a save answered in their terms.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from engramctl.protocol import Restored, Session, Snapshot

# The routes whose answers (and failures) carry the Engram names: the original five, and ours beside them.
ROUTES = frozenset(
    {
        "/save_snapshot",
        "/restore_snapshot",
        "/list_snapshots",
        "/get_snapshot_info",
        "/delete_snapshot",
        "/branch_snapshot",
        "/pin_snapshot",
        "/unpin_snapshot",
        "/label_snapshot",
        "/get_snapshot_transcript",
        "/gc_snapshots",
        "/import_snapshot",
    }
)


@dataclass(frozen=True)
class Meta:
    """A snapshot as the Engram server's metadata describes it (its list items, get_snapshot_info's
    `metadata`), plus its name in their terms."""

    conversation_id: str
    turn_number: int | None = None
    branch_name: str | None = None
    name: str | None = None  # "<conversation_id>-t<turn>", or the custom snapshot_id a save gave it

    def of(self, snap: Snapshot) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "turn_number": self.turn_number,
            "branch_name": self.branch_name,
            "timestamp": snap.created,
            "token_count": snap.n_tokens,
            "model_name": snap.model_id,
            "parent_snapshot": snap.parent,
            "name": self.name,
            "id": snap.id,
        }


def ok(**fields: Any) -> dict[str, Any]:
    return {"success": True, **fields}


def new_rid() -> str:
    """What the Engram server calls the request a restore creates; here only a correlation id."""
    return f"restored-{secrets.token_hex(4)}"


def snapshot(snap: Snapshot, meta: Meta | None = None, **extra: Any) -> dict[str, Any]:
    return ok(**item(snap, meta), **extra)


def item(snap: Snapshot, meta: Meta | None = None) -> dict[str, Any]:
    """One snapshot: our fields, then theirs (conversation_id is the session unless `meta` says otherwise)."""
    return {**snap.to_json(), "conversation_id": snap.session, **(meta.of(snap) if meta is not None else {})}


def snapshots(items: list[dict[str, Any]]) -> dict[str, Any]:
    return ok(snapshots=items)


def saved(snap: Snapshot, their_id: str, meta: Meta, **extra: Any) -> dict[str, Any]:
    """A save answered in their terms: `snapshot_id` is their id for it, ours is `id`."""
    return ok(**{**item(snap, meta), "snapshot_id": their_id}, message="Snapshot saved successfully", **extra)


def session(s: Session, **extra: Any) -> dict[str, Any]:
    return ok(**extra, **s.to_json(), conversation_id=s.name)


def restored(r: Restored, **extra: Any) -> dict[str, Any]:
    """A restore that generated nothing, with their fields (token_count: tokens in the restored state)."""
    where = f"snapshot {r.snapshot_id}" if r.snapshot_id else "no snapshot (the transcript is re-read)"
    theirs = {
        "message": f"Snapshot restored: session {r.session} continues from {where}.",
        "token_count": r.tokens,
        "rid": None,
        "mamba_pool_idx": None,
        "output_ids": None,
        "output_text": None,
    }
    return ok(**{**r.to_json(), "conversation_id": r.session, **theirs, **extra})


def generated(output_ids: list[int], output_text: str, token_count: int, **extra: Any) -> dict[str, Any]:
    """A restore-and-generate (continuation_ids) answered as the Engram server does, and more (`extra`)."""
    n = len(output_ids)
    return ok(
        rid=new_rid(),
        mamba_pool_idx=None,
        message=f"Snapshot restored; generated {n} token{'s' if n != 1 else ''}.",
        token_count=token_count,
        output_ids=output_ids,
        output_text=output_text,
        **extra,
    )


def failure(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """An error body (protocol.ErrorBody's JSON), with `success: false` and `message` on these routes."""
    if path not in ROUTES:
        return body
    return {"success": False, "message": body["error"]["message"], **body}
