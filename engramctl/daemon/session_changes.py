"""Changes that end a session's conversation (a delete, a reset) while its turns may still run.

A turn records into its session when it ends (the reply snapshot, the transcript, the hot state), so a delete or
a reset done between two of its steps would be undone by it a moment later: the session deleted comes back
holding that one turn, the session reset starts with the old question. What a user means by "delete it" or "start
over" is the conversation as they see it, so the change is refused with a 409 that names the session
(SessionBusy) while a turn of it runs or waits to run (a restore alone, which moves the head at once, too:
engram_api/restore.py), and so is deleting the snapshot a running turn will record onto (`delete_snapshot`); it
is retried once the reply has finished or been cancelled. The check and the change run
as one job on the worker, between two steps, where no turn can start or end in between.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable

from engramctl.errors import SessionBusy

if TYPE_CHECKING:
    from engramctl.daemon.context import Daemon
    from engramctl.store.records import SessionInfo


def ensure_idle(d: Daemon, session: str, change: str) -> None:
    """Raise SessionBusy if a turn of `session` runs or waits in the scheduler. Worker thread only."""
    state = d.scheduler.session_busy(session)
    if state is not None:
        raise SessionBusy(
            f"session {session!r} has a turn {state}; it cannot be {change} until that turn ends.",
            hint="wait for the reply to finish (or cancel it), then retry",
        )


def delete_snapshot(d: Daemon, snapshot_id: str, force: bool) -> None:
    """Delete one snapshot, refused (SessionBusy) while a running turn records onto it: the one it continued
    from until its prompt is recorded, its prompt snapshot after that (a session's head, which a forced
    delete would take from under it). Worker thread."""
    seq = d.scheduler.continuing_from(snapshot_id)
    if seq is not None:
        raise SessionBusy(
            f"snapshot {snapshot_id} is the state session {seq.session!r}'s running turn continues from; it "
            "cannot be deleted until that turn ends.",
            hint="wait for the reply to finish (or cancel it), then retry",
        )
    d.store.snapshots.delete(snapshot_id, force=force)


def restore_check(d: Daemon) -> Callable[[str], None]:
    """What restore.restore calls (its `idle`) before a restore alone moves a session's head: ensure_idle."""
    return functools.partial(ensure_idle, d, change="restored")


def delete(d: Daemon, session: str) -> list[str]:
    """Delete `session` (its snapshots and names), forget its hot state: the ids deleted. Worker thread."""
    ensure_idle(d, session, "deleted")
    deleted = d.store.delete_session(session)
    d.service.invalidate(session)
    d.service.states.release_retired()
    return deleted


def reset(d: Daemon, session: str) -> tuple[str | None, SessionInfo]:
    """Start `session` over (StateCache.reset): (previous head, SessionInfo). Worker thread."""
    ensure_idle(d, session, "reset")
    return d.service.states.reset(session)
