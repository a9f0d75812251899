"""Sessions and their transcripts (part of Store; see core.py).

A session is a name, a head snapshot to resume from (or none: re-prefill the transcript), an
optional branch point, and a transcript. Branching makes a new session pointing at an existing
snapshot and sharing the transcript up to it; nothing is copied.
"""

from __future__ import annotations

from typing import Any, Sequence

from engramctl.errors import NotFound, UsageError
from engramctl.store.core import StoreCore
from engramctl.store.crashpoints import crash_point
from engramctl.store.errors import AlreadyExists
from engramctl.store.names import is_snapshot_id, validate_session_name
from engramctl.store.records import SessionInfo, SnapshotRecord


class SessionsMixin(StoreCore):
    def create_session(self, name: str, *, exist_ok: bool = False) -> SessionInfo:
        validate_session_name(name)
        with self._lock, self._index.tx():
            self._check_open()
            if self._index.session(name) is not None and not exist_ok:
                raise AlreadyExists(f"session {name!r} already exists.")
            return self._ensure_session(name, self.clock())

    def get_session(self, name: str) -> SessionInfo:
        validate_session_name(name)
        with self._lock:
            self._check_open()
            s = self._index.session(name)
        if s is None:
            raise NotFound(f"no session named {name!r}.", hint="engramctl sessions")
        return s

    def has_session(self, name: str) -> bool:
        """Whether a session of that name exists (an invalid name never does)."""
        try:
            self.get_session(name)
        except (NotFound, UsageError):
            return False
        return True

    def list_sessions(self) -> list[SessionInfo]:
        with self._lock:
            self._check_open()
            return self._index.sessions()

    def touch_session(self, name: str) -> None:
        """Mark a session used now (TTL counts from here)."""
        self.get_session(name)
        with self._lock:
            self._index.update_session(name, last_used=self.clock())

    def head(self, session: str) -> SnapshotRecord | None:
        s = self.get_session(session)
        return None if s.head is None else self.info(s.head)

    def history(self, session: str) -> list[SnapshotRecord]:
        """The snapshots the session's head descends from, oldest first, whichever session owns
        them (a branch's history includes its source's earlier snapshots that still exist)."""
        s = self.get_session(session)
        if s.head is None:
            return []
        with self._lock:
            return [self._with_tiers(r) for r in self._index.ancestry(s.head)]

    def delete_session(self, name: str) -> list[str]:
        """Delete a session and its transcript. Its snapshots go too, except those another session
        still needs (head or branch point), which move to that session; so do its saved turn and branch
        names, and the branch name that named it. Returns the deleted ids."""
        self.get_session(name)
        with self._lock, self._index.tx():
            self._index.execute("DELETE FROM sessions WHERE name = ?", (name,))
            self._index.execute("DELETE FROM names WHERE scope = ? OR session = ?", (name, name))
            referenced = self._index.referenced_ids()
            victims = []
            for s in self._index.snapshots(name):
                if s.id in referenced:
                    self._index.update_snapshot(s.id, session=self._index.referrers(s.id)[0])
                else:
                    victims.append(s.id)
            self._remove(victims)
            self._transcripts.collect()
        return victims

    def branch(self, source: str, new_session: str) -> SessionInfo:
        """New session whose head is `source` (a snapshot id, or a session's current head); it shares
        the transcript up to that point. No payload is copied; the source stays protected."""
        validate_session_name(new_session)
        with self._lock, self._index.tx():
            self._check_open()
            if self._index.session(new_session) is not None:
                raise AlreadyExists(f"session {new_session!r} already exists.", hint="pick another name")
            snap = self._index.snapshot(source) if is_snapshot_id(source) else None
            if snap is not None:
                head, tip, fp, model = snap.id, self._index.snapshot_tip(snap.id), snap.fingerprint, snap.model_id
            else:
                src = self._index.session(validate_session_name(source))
                if src is None:
                    raise NotFound(f"no session or snapshot named {source!r} to branch from.")
                head, tip, fp, model = src.head, self._index.session_tip(source), src.fingerprint, src.model_id
            now = self.clock()
            self._index.insert_session(
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
            return self._index.session(new_session)  # type: ignore[return-value]

    def set_head(self, session: str, snapshot_id: str | None, *, rewind_transcript: bool = True) -> SessionInfo:
        """Resume `session` from `snapshot_id` next time (restore). With rewind_transcript, the
        transcript becomes the one the snapshot was taken at. None = resume from the transcript."""
        self.get_session(session)
        with self._lock, self._index.tx():
            fields: dict[str, Any] = {"head": None, "last_used": self.clock()}
            if snapshot_id is not None:
                rec = self._row(snapshot_id)
                fields.update(head=rec.id, fingerprint=rec.fingerprint, model_id=rec.model_id)
                if rewind_transcript:
                    fields["tip"] = self._index.snapshot_tip(rec.id)
            self._index.update_session(session, **fields)
            return self._index.session(session)  # type: ignore[return-value]

    def reset_session(self, name: str) -> SessionInfo:
        """Start the session over: no head, an empty transcript. Nothing is deleted: its snapshots stay
        (retention may still apply to them later) and each keeps the transcript it was taken at."""
        self.get_session(name)
        with self._lock, self._index.tx():
            self._index.update_session(name, head=None, tip=None, last_used=self.clock())
            return self._index.session(name)  # type: ignore[return-value]

    # -- transcripts ---------------------------------------------------------------------------------
    def append_messages(self, session: str, messages: Sequence[dict]) -> int:
        """Append to a session's transcript (creating the session); returns its new length."""
        self.create_session(session, exist_ok=True)
        with self._lock, self._index.tx():
            tip = self._transcripts.append(self._index.session_tip(session), messages)
            self._index.update_session(session, tip=tip, last_used=self.clock())
            return self._transcripts.depth(tip)

    def transcript(self, session: str, limit: int | None = None) -> list[dict]:
        self.get_session(session)
        with self._lock:
            return self._transcripts.read(self._index.session_tip(session), limit)

    def snapshot_transcript(self, snapshot_id: str) -> list[dict]:
        """The transcript exactly as it was when the snapshot was taken."""
        with self._lock:
            return self._transcripts.read(self._index.snapshot_tip(self._row(snapshot_id).id))

    def set_transcript(self, session: str, messages: Sequence[dict]) -> int:
        self.create_session(session, exist_ok=True)
        with self._lock, self._index.tx():
            tip = self._transcripts.replace(self._index.session_tip(session), messages)
            self._index.update_session(session, tip=tip, last_used=self.clock())
            return self._transcripts.depth(tip)

    def truncate_transcript(self, session: str, n_messages: int) -> int:
        self.get_session(session)
        with self._lock, self._index.tx():
            tip = self._transcripts.ancestor(self._index.session_tip(session), n_messages)
            self._index.update_session(session, tip=tip, last_used=self.clock())
            return n_messages
