"""Snapshot routes compatible with the original Engram server (POST + JSON bodies;
`conversation_id` and `session` name the same thing), plus /branch_snapshot and the management
routes the CLI needs while the daemon owns the store: /pin_snapshot, /unpin_snapshot,
/label_snapshot, /get_snapshot_transcript, /gc_snapshots, /import_snapshot (raw file body).

Answers are protocol objects (Snapshot, Session, Restored) in the Engram names (engram.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from engramctl.daemon import engram
from engramctl.daemon.context import daemon_of
from engramctl.daemon.schemas import (
    BranchSnapshotRequest, DeleteSnapshotRequest, LabelSnapshotRequest, ListSnapshotsRequest, PinSnapshotRequest,
    RestoreSnapshotRequest, SaveSnapshotRequest, SnapshotInfoRequest, SnapshotRef,
)  # fmt: skip
from engramctl.daemon.service import Restored as RestoredState
from engramctl.daemon.streaming import Completion, answer_turn, job_result
from engramctl.errors import NotFound, UsageError
from engramctl.protocol import Restored, Session, Snapshot
from engramctl.store.names import is_id_prefix, is_snapshot_id

router = APIRouter()


@router.post("/save_snapshot")
async def save_snapshot(body: SaveSnapshotRequest, request: Request):
    d = daemon_of(request)
    name = _required_session(body.session_name)
    job = d.worker.submit(lambda job: d.service.save(name, body.label, body.pin), name="save_snapshot")
    sid = await job_result(job, request)
    return engram.snapshot(_snapshot(d, sid))


@router.post("/restore_snapshot")
async def restore_snapshot(body: RestoreSnapshotRequest, request: Request):
    d = daemon_of(request)  # body.model: any name means the served model (routes_openai)
    continuation = body.continuation_message()
    params = body.params()

    def run(job):
        out = d.service.restore(body.snapshot_id, body.session_name, continuation, params, job.emit, job.cancel)
        return engram.restored(_restored(out)) if isinstance(out, RestoredState) else out

    job = d.worker.submit(run, name="restore_snapshot")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = body.stream and continuation is not None
    return await answer_turn(job, request, Completion(d.model_id, d.engine.info.fingerprint), stream, include_usage)


@router.get("/list_snapshots")
async def list_snapshots_get(query: Annotated[ListSnapshotsRequest, Query()], request: Request):
    """All snapshots, or one session's (?session=NAME or ?conversation_id=NAME), oldest first."""
    return _list(request, query)


@router.post("/list_snapshots")
async def list_snapshots(request: Request, body: ListSnapshotsRequest | None = None):
    """All snapshots, or one session's, oldest first. The body may be left out (lists everything)."""
    return _list(request, body or ListSnapshotsRequest())


def _list(request: Request, body: ListSnapshotsRequest) -> dict:
    return engram.snapshots([Snapshot.from_record(r) for r in daemon_of(request).store.list(body.session_name)])


@router.post("/get_snapshot_info")
async def get_snapshot_info(body: SnapshotInfoRequest, request: Request):
    d = daemon_of(request)
    if body.snapshot_id is not None:
        sid = d.store.resolve(body.snapshot_id)
    else:
        info = d.store.get_session(body.session_name)
        if info.head is None:
            raise NotFound(f"session {info.name!r} has no snapshot yet.")
        sid = info.head
    return engram.snapshot(_snapshot(d, sid))


@router.post("/delete_snapshot")
async def delete_snapshot(body: DeleteSnapshotRequest, request: Request):
    d = daemon_of(request)
    sid = d.store.resolve(body.snapshot_id)
    d.store.delete(sid, force=body.force)
    return engram.ok(snapshot_id=sid)


@router.post("/branch_snapshot")
async def branch_snapshot(body: BranchSnapshotRequest, request: Request):
    d = daemon_of(request)
    if body.snapshot_id is not None:
        source = d.store.resolve(body.snapshot_id)
    elif body.source is not None and is_id_prefix(body.source) and not is_snapshot_id(body.source) \
            and not d.store.has_session(body.source):
        source = d.store.resolve(body.source)  # an id prefix (a session by that name would win)
    else:
        source = body.source_ref
    info = d.store.branch(source, body.new_session)
    return engram.session(Session.from_info(info), source=source)


@router.post("/pin_snapshot")
async def pin_snapshot(body: PinSnapshotRequest, request: Request):
    """Pin any snapshot (retention never deletes it), optionally labelling it too."""
    d = daemon_of(request)
    sid = d.store.resolve(body.snapshot_id)
    if body.label is not None:
        d.store.label(sid, body.label)
    return engram.snapshot(Snapshot.from_record(d.store.pin(sid)))


@router.post("/unpin_snapshot")
async def unpin_snapshot(body: SnapshotRef, request: Request):
    d = daemon_of(request)
    return engram.snapshot(Snapshot.from_record(d.store.unpin(d.store.resolve(body.snapshot_id))))


@router.post("/label_snapshot")
async def label_snapshot(body: LabelSnapshotRequest, request: Request):
    """Set (or with null, clear) a snapshot's label."""
    d = daemon_of(request)
    return engram.snapshot(Snapshot.from_record(d.store.label(d.store.resolve(body.snapshot_id), body.label)))


@router.post("/get_snapshot_transcript")
async def get_snapshot_transcript(body: SnapshotRef, request: Request):
    """The transcript exactly as it was when the snapshot was taken (whatever its session did since)."""
    d = daemon_of(request)
    rec = d.store.info(d.store.resolve(body.snapshot_id))
    messages = d.store.snapshot_transcript(rec.id)
    return engram.ok(snapshot_id=rec.id, session=rec.session, conversation_id=rec.session, n_messages=len(messages),
                     messages=messages)  # fmt: skip


@router.post("/gc_snapshots")
async def gc_snapshots(request: Request):
    """Apply retention now (keep-last-N, TTL, disk budget; pins and session heads are never deleted).
    Returns {deleted: {snapshot_id: reason}, freed_bytes, messages_removed}."""
    report = await run_in_threadpool(daemon_of(request).store.gc)
    return engram.ok(**report.to_json())


@router.post("/import_snapshot")
async def import_snapshot(request: Request, session: str | None = None, conversation_id: str | None = None,
                          label: str | None = None):  # fmt: skip
    """Body: the raw bytes of a file written by `snapshots export`. Query: session (default: the one the
    file records), label. Verified like a restore, then stored as the head of a new session."""
    from engramctl.daemon.imports import import_file

    d = daemon_of(request)
    if session is not None and conversation_id is not None and session != conversation_id:
        raise UsageError("session and conversation_id name the same thing; give one.")
    name = session if session is not None else conversation_id
    buf = await request.body()
    job = d.worker.submit(lambda job: import_file(d.engine, d.store, buf, name, label), name="import_snapshot")
    rec, n_messages = await job_result(job, request)
    return engram.snapshot(Snapshot.from_record(rec), messages=n_messages)


def _required_session(name: str | None) -> str:
    if name is None:
        raise UsageError("give the session (or conversation_id) to snapshot.")
    return name


def _snapshot(d, sid: str) -> Snapshot:
    return Snapshot.from_record(d.store.info(sid))


def _restored(r: RestoredState) -> Restored:
    """The service's answer to a restore that generated nothing, as it goes on the wire."""
    return Restored(session=r.session, snapshot_id=r.snapshot_id, tokens=r.tokens, tier=r.origin.tier,
                    restore_ms=r.origin.restore_ms, n_messages=r.n_messages)  # fmt: skip
