"""Sessions (a Store part: `store.sessions`).

A session is a name, a head snapshot to resume from (or none: re-prefill the transcript), an
optional branch point, and a transcript (transcript.py). Branching makes a new session pointing at an
existing snapshot and sharing the transcript up to it; nothing is copied.
"""

from __future__ import annotations

from typing import Any

from engramctl.errors import NotFound, UsageError
from engramctl.store.core import StoreCore
from engramctl.store.crashpoints import crash_point
from engramctl.errors import AlreadyExists
from engramctl.store.names import is_snapshot_id, validate_session_name
from engramctl.store.records import SessionInfo, SnapshotRecord


class Sessions:
    def __init__(self, core: StoreCore):
        self._core = core

    def create(self, name: str, *, exist_ok: bool = False) -> SessionInfo:
        c = self._core
        validate_session_name(name)
        with c.lock, c.index.tx():
            c.check_open()
            if c.index.session(name) is not None and not exist_ok:
                raise AlreadyExists(f"session {name!r} already exists.")
            return c.ensure_session(name, c.clock())

    def get(self, name: str) -> SessionInfo:
        c = self._core
        validate_session_name(name)
        with c.lock:
            c.check_open()
            s = c.index.session(name)
            if s is None:
                raise NotFound(f"no session named {name!r}.", hint="engramctl sessions")
            return c.with_head_tiers(s)

    def has(self, name: str) -> bool:
        """Whether a session of that name exists (an invalid name never does)."""
        try:
            self.get(name)
        except (NotFound, UsageError):
            return False
        return True

    def list(self) -> list[SessionInfo]:
        c = self._core
        with c.lock:
            c.check_open()
            return [c.with_head_tiers(s) for s in c.index.sessions()]

    def count(self) -> int:
        """How many sessions there are (list()'s sums cost ~0.1 s at a thousand; this counts rows)."""
        c = self._core
        with c.lock:
            c.check_open()
            return c.index.session_count()

    def touch(self, name: str) -> None:
        """Mark a session used now (TTL counts from here)."""
        self.get(name)
        with self._core.lock:
            self._core.index.update_session(name, last_used=self._core.clock())

    def head(self, session: str) -> SnapshotRecord | None:
        s = self.get(session)
        if s.head is None:
            return None
        with self._core.lock:
            return self._core.with_tiers(self._core.row(s.head))

    def history(self, session: str) -> list[SnapshotRecord]:
        """The snapshots the session's head descends from, oldest first, whichever session owns
        them (a branch's history includes its source's earlier snapshots that still exist)."""
        s = self.get(session)
        if s.head is None:
            return []
        with self._core.lock:
            return [self._core.with_tiers(r) for r in self._core.index.ancestry(s.head)]

    def delete(self, name: str) -> list[str]:
        """Delete a session and its transcript. Its snapshots go too, except those another session
        still needs (head or branch point), which move to that session. Returns the deleted ids.
        (Store.delete_session also forgets the session's Engram API names, in the same transaction.)"""
        c = self._core
        self.get(name)
        with c.lock, c.index.tx():
            c.index.execute("DELETE FROM sessions WHERE name = ?", (name,))
            referenced = c.index.referenced_ids()
            victims = []
            for s in c.index.snapshots(name):
                if s.id in referenced:
                    c.index.update_snapshot(s.id, session=c.index.referrers(s.id)[0])
                else:
                    victims.append(s.id)
            c.remove(victims)
            c.messages.collect()
        return victims

    def branch(self, source: str, new_session: str) -> SessionInfo:
        """New session whose head is `source` (a snapshot id, or a session's current head); it shares
        the transcript up to that point. No payload is copied; the source stays protected."""
        c = self._core
        validate_session_name(new_session)
        with c.lock, c.index.tx():
            c.check_open()
            if c.index.session(new_session) is not None:
                raise AlreadyExists(f"session {new_session!r} already exists.", hint="pick another name")
            snap = c.index.snapshot(source) if is_snapshot_id(source) else None
            if snap is not None:
                head, tip, fp, model = snap.id, c.index.snapshot_tip(snap.id), snap.fingerprint, snap.model_id
            else:
                src = c.index.session(validate_session_name(source))
                if src is None:
                    raise NotFound(f"no session or snapshot named {source!r} to branch from.")
                head, tip, fp, model = src.head, c.index.session_tip(source), src.fingerprint, src.model_id
            now = c.clock()
            c.index.insert_session(
                name=new_session,
                head=head,
                base=head,
                tip=tip,
                fingerprint=fp,
                model_id=model,
                created=now,
                last_used=now,
            )
            crash_point("branch.indexed")
            return c.index.session(new_session)  # type: ignore[return-value]

    def set_head(self, session: str, snapshot_id: str | None, *, rewind_transcript: bool = True) -> SessionInfo:
        """Resume `session` from `snapshot_id` next time (restore). With rewind_transcript, the
        transcript becomes the one the snapshot was taken at. None = resume from the transcript."""
        c = self._core
        self.get(session)
        with c.lock, c.index.tx():
            fields: dict[str, Any] = {"head": None, "last_used": c.clock()}
            if snapshot_id is not None:
                rec = c.row(snapshot_id)
                fields.update(head=rec.id, fingerprint=rec.fingerprint, model_id=rec.model_id)
                if rewind_transcript:
                    fields["tip"] = c.index.snapshot_tip(rec.id)
            c.index.update_session(session, **fields)
            return c.index.session(session)  # type: ignore[return-value]

    def reset(self, name: str) -> SessionInfo:
        """Start the session over: no head, an empty transcript. Nothing is deleted: its snapshots stay
        (retention may still apply to them later) and each keeps the transcript it was taken at."""
        c = self._core
        self.get(name)
        with c.lock, c.index.tx():
            c.index.update_session(name, head=None, tip=None, last_used=c.clock())
            return c.index.session(name)  # type: ignore[return-value]
