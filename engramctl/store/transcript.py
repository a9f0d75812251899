"""Transcripts: a session's conversation, kept as a tree of immutable messages in the index.

A message row holds one chat message (JSON text, never pickle), its parent and its depth (1-based
position in the conversation). A transcript is identified by its last message, the "tip"; reading it
walks parents to the root. So a branch shares its source's messages, a restore just moves the tip
back, and a snapshot records the tip it corresponds to: its transcript stays exact whatever happens to
the session later. Messages that no session or snapshot can reach are removed by `collect`.

The tree itself is store/messages.py's MessageTree (tips in, tips out); Transcripts, the store's part
(`store.transcripts`), reads and changes a session's or a snapshot's transcript through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from engramctl.store.core import StoreCore
    from engramctl.store.sessions import Sessions


class Transcripts:
    """Sessions' and snapshots' transcripts (a Store part)."""

    def __init__(self, core: StoreCore, sessions: Sessions):
        self._core, self._sessions = core, sessions

    def append(self, session: str, messages: Sequence[dict]) -> int:
        """Append to a session's transcript (creating the session); returns its new length."""
        return self._rewrite(session, lambda tip: self._core.messages.append(tip, messages))

    def of_session(self, session: str, limit: int | None = None) -> list[dict]:
        c = self._core
        self._sessions.get(session)
        with c.lock:
            return c.messages.read(c.index.session_tip(session), limit)

    def of_snapshot(self, snapshot_id: str) -> list[dict]:
        """The transcript exactly as it was when the snapshot was taken."""
        c = self._core
        with c.lock:
            return c.messages.read(c.index.snapshot_tip(c.row(snapshot_id).id))

    def replace(self, session: str, messages: Sequence[dict]) -> int:
        """Make a session's transcript `messages` (creating the session), sharing what it starts with."""
        return self._rewrite(session, lambda tip: self._core.messages.replace(tip, messages))

    def truncate(self, session: str, n_messages: int) -> int:
        c = self._core
        self._sessions.get(session)
        with c.lock, c.index.tx():
            tip = c.messages.ancestor(c.index.session_tip(session), n_messages)
            c.index.update_session(session, tip=tip, last_used=c.clock())
            return n_messages

    def _rewrite(self, session: str, move: Callable[[int | None], int | None]) -> int:
        """Move the session's tip to `move(tip)` in one transaction; returns the transcript's new length."""
        c = self._core
        with c.lock, c.index.tx():  # the session's creation joins it: one commit (one WAL fsync), not two
            self._sessions.create(session, exist_ok=True)
            tip = move(c.index.session_tip(session))
            c.index.update_session(session, tip=tip, last_used=c.clock())
            return c.messages.depth(tip)
