"""Restoring and saving a session's state, on the worker: what /restore_snapshot and /save_snapshot do (and
the agent tools' restore_checkpoint and checkpoint, and `engramctl chat` opening a session, through them).

A restore makes a snapshot (or a session's head) the state a session continues from and loads it
(daemon/state_cache.py `StateCache.restore`): the answer is a protocol.Restored. With a continuation
message it is a turn from there instead (daemon/service.py: a turn is the service's), and with `then`
whatever turn the caller runs from there: restore-and-generate's (continuation.py), from the base the
restore resolved. A save pins (and labels) the session's head, snapshotting a session that has only a
transcript first.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from engramctl.daemon.job import Job
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.service import ConversationService, plain
from engramctl.engine.sampling_params import SamplingParams
from engramctl.errors import UsageError
from engramctl.protocol import Restored
from engramctl.store.names import validate_label

# A turn run from a restored state: (session, (transcript, head), before_commit, t0) -> the planned turn.
TurnFrom = Callable[[str, tuple[list[dict], "str | None"], "Callable[[], Any] | None", float], Sequence]


def restore(
    service: ConversationService,
    snapshot_ref: str | None,
    session: str | None,
    continuation: dict | None = None,
    params: SamplingParams | None = None,
    job: Job | None = None,
    *,
    then: TurnFrom | None = None,
    idle: Callable[[str], None] | None = None,
) -> Restored | Sequence:
    """Make a snapshot (or a session's head) the state a session continues from and load it into memory;
    with a continuation message generate from there, and with `then` run that turn from there:
    then(session, (transcript, head), before_commit, t0), before_commit making the restore stick.
    A restore alone moves the session's head at once: `idle(session)` refuses it first while a turn of
    that session runs (session_changes.ensure_idle); a turn from there waits for that one in the scheduler."""
    t0 = time.perf_counter()
    store = service.store
    service.states.release_retired()
    if snapshot_ref is not None:
        sid = store.resolve(snapshot_ref)
        target = session or store.snapshots.info(sid).session
        if session is not None and not store.sessions.has(target):
            before: Callable[[], Any] | None = lambda: store.sessions.branch(sid, target)  # noqa: E731
        else:
            before = lambda: store.sessions.set_head(target, sid)  # noqa: E731
        transcript, head = store.transcripts.of_snapshot(sid), sid
    elif session is not None:
        target, before = session, None
        head = store.sessions.get(session).head
        transcript = store.transcripts.of_session(session)
    else:
        raise UsageError("give a snapshot id, or a session to restore its head.")
    if continuation is not None:
        return service.turn_from(
            target,
            [continuation],
            params or SamplingParams(),
            job,
            t0,
            base=(transcript, head),
            before_commit=before,
        )
    if then is not None:
        return then(target, (transcript, head), before, t0)
    if idle is not None:
        idle(target)
    return service.states.restore(target, head, before, len(transcript))


def save(service: ConversationService, session: str, label: str | None, pin: bool) -> str:
    """Pin (and label) the session's head; a session without one is re-prefilled from its transcript and
    snapshotted first. Returns the snapshot id."""
    store, states = service.store, service.states
    states.release_retired()
    if label is not None:
        validate_label(label)
    head = store.sessions.get(session).head
    if head is None:
        transcript = [plain(m) for m in store.transcripts.of_session(session)]
        if not transcript:
            raise UsageError(f"session {session!r} has no conversation to snapshot yet.")
        live = states.from_transcript(transcript)
        try:
            head = service.recorder.commit(session, service.engine.capture(live), "saved").id
        except BaseException:
            service.engine.release(live)
            raise
        states.keep(session, head, live)
    if label is not None:
        store.snapshots.label(head, label)
    if pin:
        store.snapshots.pin(head)
    return head
