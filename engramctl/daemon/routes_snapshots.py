"""Snapshot routes compatible with the original Engram server (POST + JSON bodies;
`conversation_id` and `session` name the same thing), plus /branch_snapshot and the management
routes the CLI needs while the daemon owns the store: /pin_snapshot, /unpin_snapshot,
/label_snapshot, /get_snapshot_transcript, /gc_snapshots, /import_snapshot (raw file body).

The five Engram routes also take that server's own fields: the turn_number / branch_name selectors, a
custom snapshot_id, and restore-and-generate (continuation_ids, max_new_tokens); its names for snapshots
live in the store (store/aliases.py). docs/engram-api.md says what each does and where we differ.

Answers are protocol objects (Snapshot, Session, Restored) in the Engram names (engram.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from engramctl.daemon import engram
from engramctl.daemon.context import daemon_of
from engramctl.daemon.schemas import (
    ENGRAM_FIELDS,
    BranchSnapshotRequest,
    DeleteSnapshotRequest,
    LabelSnapshotRequest,
    ListSnapshotsRequest,
    PinSnapshotRequest,
    RestoreSnapshotRequest,
    SaveSnapshotRequest,
    SnapshotInfoRequest,
    SnapshotRef,
)
from engramctl.daemon.service import Restored as RestoredState
from engramctl.daemon.streaming import Completion, answer_turn, engram_json, finish_reason, job_result, usage_json
from engramctl.errors import NotFound, UsageError
from engramctl.protocol import Restored, Session, Snapshot
from engramctl.store.names import is_id_prefix, is_snapshot_id, named_session

router = APIRouter()
SAVE_DURABLE_S = 60.0  # how long a save waits for its snapshot's file before answering (durable: false)


@router.post("/save_snapshot")
async def save_snapshot(body: SaveSnapshotRequest, request: Request):
    """Pin (and label) the conversation's current state; with the Engram server's selectors, also name it:
    turn_number N (then "<conversation_id>-tN" names it), branch_name B (a branch session there) and/or a
    custom snapshot_id."""
    d = daemon_of(request)
    name = _required_session(body.session_name)

    def run(job):
        sid = d.service.save(name, body.label, body.pin)
        branch = None
        if body.branch_name is not None:
            branch = d.store.save_branch(name, body.branch_name, sid).name
        elif body.turn_number is not None:
            d.store.name_turn(name, body.turn_number, sid)
        if body.snapshot_id is not None:
            d.store.name_snapshot(body.snapshot_id, sid)
        return sid, branch

    job = d.worker.submit(run, name="save_snapshot")
    sid, branch = await job_result(job, request)
    await run_in_threadpool(d.store.wait_durable, sid, SAVE_DURABLE_S)  # saved means on disk (their contract)
    snap = _snapshot(d, sid)
    if not body.engram:
        return engram.snapshot(snap)
    turn = body.turn_number if body.turn_number is not None else _names(d, [snap])[0].get(snap.id)
    conversation = body.conversation or name
    their_id = body.snapshot_id or f"{conversation}-t{turn or 0}"
    meta = engram.Meta(conversation, turn, body.branch_name, their_id)
    return engram.saved(snap, their_id, meta, **({"branch_session": branch} if branch else {}))


@router.post("/restore_snapshot")
async def restore_snapshot(body: RestoreSnapshotRequest, request: Request):
    """Restore a snapshot (by id or name, a conversation's head, turn_number or branch_name); with a
    continuation message answer a chat completion, with continuation_ids (token ids) the Engram server's
    restore-and-generate answer."""
    d = daemon_of(request)  # body.model: any name means the served model (routes_openai)
    continuation, ids = body.continuation_message(), body.continuation_ids
    params = body.token_params() if ids is not None else body.params()
    ref, session, conversation = body.snapshot_id, body.session_name, body.conversation
    if body.branch_name is not None:  # the branch's own session, at its head: a turn continues the branch
        session = _branch_session(d, body)
    elif body.turn_number is not None:
        ref = _turn_snapshot(d, body)

    def run(job):
        out = d.service.restore(ref, session, continuation, params, job.emit, job.cancel, continuation_ids=ids)
        if isinstance(out, RestoredState):
            r = _restored(out)
            extra = {"rid": engram.new_rid()} if body.create_new_request else {}
            if r.snapshot_id is not None:  # a branch's turns are named after its own session
                label = conversation if body.branch_name is None else None
                meta = _meta(d, r.snapshot_id, conversation, scope=r.session, label=label, branch=body.branch_name)
                extra |= {"turn_number": meta.turn_number, "branch_name": meta.branch_name, "name": meta.name}
            if conversation is not None:
                extra["conversation_id"] = conversation
            return engram.restored(r, **extra, **_request_id(body))
        if ids is None:
            return out
        return _generated(d, out, ids, conversation, body)

    job = d.worker.submit(run, name="restore_snapshot")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = body.stream and continuation is not None
    return await answer_turn(job, request, Completion(d.model_id, d.engine.info.fingerprint), stream, include_usage)


@router.get("/list_snapshots")
async def list_snapshots_get(query: Annotated[ListSnapshotsRequest, Query()], request: Request):
    """All snapshots, or one session's (?session=NAME), oldest first; ?conversation_id=NAME lists one
    conversation as the Engram server does (see the POST route)."""
    return await run_in_threadpool(_list, request, query)


@router.post("/list_snapshots")
async def list_snapshots(request: Request, body: ListSnapshotsRequest | None = None):
    """All snapshots, or one session's, oldest first. The body may be left out (lists everything).
    Named by conversation_id, a conversation is listed as the Engram server lists it: its turns by
    turn_number, then its branches by name; an unknown conversation is an empty list."""
    return await run_in_threadpool(_list, request, body or ListSnapshotsRequest())


def _list(request: Request, body: ListSnapshotsRequest) -> dict:
    d = daemon_of(request)
    name = body.session_name
    if not body.engram:
        snaps = [Snapshot.from_record(r) for r in d.store.list(name)]
        turns, names = _names(d, snaps)
        return engram.snapshots(
            [engram.item(s, engram.Meta(s.session, turns.get(s.id), None, names.get(s.id))) for s in snaps]
        )
    conversation = body.conversation
    if not d.store.has_session(name):
        return engram.snapshots([])
    turns = d.store.turns(name)
    custom = d.store.custom_ids(turns.values())
    items = [
        engram.item(_snapshot(d, sid), engram.Meta(conversation, n, None, custom.get(sid) or f"{conversation}-t{n}"))
        for n, sid in turns.items()
    ]
    for branch, branch_session in d.store.branches(name).items():
        head = d.store.get_session(branch_session).head
        if head is not None:
            meta = _meta(d, head, conversation, scope=branch_session, branch=branch)
            items.append(engram.item(_snapshot(d, head), meta))
    return engram.snapshots(items)


@router.post("/get_snapshot_info")
async def get_snapshot_info(body: SnapshotInfoRequest, request: Request):
    """One snapshot (id or name), a conversation's head, or the Engram server's turn_number / branch_name
    of a conversation; its metadata in their terms under `metadata` (with fill_ids: the token ids)."""
    d = daemon_of(request)
    if body.snapshot_id is not None:
        sid = d.store.resolve(body.snapshot_id)
    elif body.branch_name is not None:
        sid = _head(d, _branch_session(d, body), body)
    elif body.turn_number is not None:
        sid = _turn_snapshot(d, body)
    else:
        sid = _head(d, body.session_name, body)
    snap = _snapshot(d, sid)
    if body.branch_name is not None and body.snapshot_id is None:
        meta = _meta(d, sid, body.conversation, scope=_branch_session(d, body), branch=body.branch_name)
    else:
        meta = _meta(d, sid, body.conversation, scope=body.session_name, label=body.conversation)
    metadata = {**meta.of(snap), "fill_ids": await run_in_threadpool(d.store.token_ids, sid)}
    return engram.snapshot(snap, meta, metadata=metadata)


@router.post("/delete_snapshot")
async def delete_snapshot(body: DeleteSnapshotRequest, request: Request):
    """One snapshot (id or name; a head, branch point or pinned one needs force), or the Engram server's
    turn_number of a conversation (force by default, as their delete is), or a branch_name: the branch's
    session goes, as DELETE /v1/sessions/{name} would."""
    d = daemon_of(request)
    if body.branch_name is not None:
        name = _branch_session(d, body)
        deleted = d.store.delete_session(name)
        d.service.invalidate(name)
        return engram.ok(
            message="Snapshot deleted successfully",
            conversation_id=body.conversation,
            branch_name=body.branch_name,
            session=name,
            deleted=deleted,
        )
    if body.snapshot_id is not None:
        sid = d.store.resolve(body.snapshot_id)
        d.store.delete(sid, force=bool(body.force))
        ours = is_id_prefix(body.snapshot_id.strip().lower()) and not body.given("conversation_id", *ENGRAM_FIELDS)
        if ours:
            return engram.ok(snapshot_id=sid)
        return engram.ok(snapshot_id=sid, message="Snapshot deleted successfully")
    sid = _turn_snapshot(d, body)
    d.store.delete(sid, force=True if body.force is None else body.force)
    return engram.ok(
        snapshot_id=sid,
        message="Snapshot deleted successfully",
        conversation_id=body.conversation,
        turn_number=body.turn_number,
    )


@router.post("/branch_snapshot")
async def branch_snapshot(body: BranchSnapshotRequest, request: Request):
    d = daemon_of(request)
    if body.snapshot_id is not None:
        source = d.store.resolve(body.snapshot_id)
    elif (
        body.source is not None
        and is_id_prefix(body.source)
        and not is_snapshot_id(body.source)
        and not d.store.has_session(body.source)
    ):
        source = d.store.resolve(body.source)  # an id prefix (a session by that name would win)
    elif body.source is not None and not d.store.has_session(body.source) and d.store.is_snapshot_name(body.source):
        source = d.store.resolve(body.source)  # a name the Engram routes gave a snapshot (custom id, <conv>-t<N>)
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
    return engram.ok(
        snapshot_id=rec.id,
        session=rec.session,
        conversation_id=rec.session,
        n_messages=len(messages),
        messages=messages,
    )


@router.post("/gc_snapshots")
async def gc_snapshots(request: Request):
    """Apply retention now (keep-last-N, TTL, disk budget; pins and session heads are never deleted).
    Returns {deleted: {snapshot_id: reason}, freed_bytes, messages_removed}."""
    report = await run_in_threadpool(daemon_of(request).store.gc)
    return engram.ok(**report.to_json())


# The body is read raw (request.body()), so FastAPI cannot see it: the document says what it is.
_IMPORT_BODY = {
    "requestBody": {
        "required": True,
        "description": "The bytes of a file written by `engramctl snapshots export`.",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


@router.post("/import_snapshot", openapi_extra=_IMPORT_BODY)
async def import_snapshot(
    request: Request,
    session: Annotated[str | None, Query(json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,64}$"})] = None,
    conversation_id: Annotated[str | None, Query(json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,255}$"})] = None,
    label: Annotated[str | None, Query(json_schema_extra={"pattern": "^[^\\x00-\\x1f\\x7f]{1,128}$"})] = None,
):
    """Body: the raw bytes of a file written by `snapshots export`. Query: session (default: the one the
    file records), label. Verified like a restore, then stored as the head of a new session."""
    from engramctl.daemon.imports import import_file

    d = daemon_of(request)
    name = named_session(session, conversation_id)
    buf = await request.body()
    job = d.worker.submit(lambda job: import_file(d.engine, d.store, buf, name, label), name="import_snapshot")
    rec, n_messages = await job_result(job, request)
    return engram.snapshot(Snapshot.from_record(rec), messages=n_messages)


def _not_found(body, turn: int | None = None, branch: str | None = None) -> NotFound:
    """The Engram server's words for a selector that names nothing."""
    return NotFound(f"Snapshot not found: conversation={body.conversation}, turn={turn}, branch={branch}.")


def _turn_snapshot(d, body) -> str:
    """The snapshot turn `body.turn_number` of the request's conversation names (store/aliases.py)."""
    name = body.session_name
    sid = d.store.find_turn(name, body.turn_number) if d.store.has_session(name) else None
    if sid is None:
        raise _not_found(body, turn=body.turn_number)
    return sid


def _branch_session(d, body) -> str:
    """The session that is branch `body.branch_name` of the request's conversation."""
    name = body.session_name
    branch = d.store.branch_session(name, body.branch_name) if d.store.has_session(name) else None
    if branch is None:
        raise _not_found(body, turn=body.turn_number, branch=body.branch_name)
    return branch


def _head(d, name: str, body) -> str:
    info = d.store.get_session(name)
    if info.head is None:
        if body.branch_name is not None:
            raise _not_found(body, branch=body.branch_name)
        raise NotFound(f"session {info.name!r} has no snapshot yet.")
    return info.head


def _names(d, snaps: list[Snapshot]) -> tuple[dict[str, int], dict[str, str]]:
    """For snapshots: the turn each is of its own session (snapshot id -> turn number) and its name in the
    Engram server's terms (the custom id a save gave it, else "<session>-t<turn>" when that names it)."""
    turns: dict[str, int] = {}
    names: dict[str, str] = {}
    for session in sorted({s.session for s in snaps}):
        for n, sid in d.store.turns(session).items():
            if sid not in turns:
                turns[sid], names[sid] = n, f"{session}-t{n}"
    names.update(d.store.custom_ids([s.id for s in snaps]))
    return turns, names


def _meta(
    d,
    sid: str,
    conversation: str | None,
    *,
    scope: str | None = None,
    label: str | None = None,
    branch: str | None = None,
) -> engram.Meta:
    """A snapshot's metadata in the Engram server's terms: its turn within session `scope` (default: its
    own session), which names it "<label>-t<turn>" (label: the conversation_id the client gave, else the
    session), unless a save gave it a custom id. `conversation` is the conversation_id to report."""
    rec = d.store.info(sid)
    scope = scope or rec.session
    turns = d.store.turns(scope) if d.store.has_session(scope) else {}
    turn = next((n for n, s in turns.items() if s == sid), None)
    name = d.store.custom_ids([sid]).get(sid)
    if name is None and turn is not None:
        name = f"{label or scope}-t{turn}"
    if turn is None:
        turn = d.store.turn_numbers([sid]).get(sid)
    return engram.Meta(conversation or scope, turn, branch, name)


def _generated(d, r, ids: list[int], conversation: str | None, body: RestoreSnapshotRequest) -> dict:
    """The answer to a restore-and-generate: the Engram server's fields, then ours (the new head's
    snapshot_id and names, usage, the `engram` turn info)."""
    out = list(r.finish.token_ids)
    if out and r.finish.reason == "stop" and out[-1] in d.engine.tokenizer.eos_ids:
        out = out[:-1]  # as theirs: the stop token is not part of the output
    head, session = r.snapshot_id, r.start.session
    label = conversation if body.branch_name is None else None
    meta = None if head is None else _meta(d, head, conversation, scope=session, label=label)
    theirs = {"branch_name": body.branch_name}
    if meta is not None:
        theirs |= {"turn_number": meta.turn_number, "name": meta.name}
    return engram.generated(
        out,
        r.text,
        r.start.prompt.prompt_tokens - len(ids),
        **_request_id(body),
        conversation_id=conversation or session,
        session=session,
        snapshot_id=head,
        **theirs,
        finish_reason=finish_reason(r),
        usage=usage_json(r),
        engram=engram_json(r),
    )


def _request_id(body: RestoreSnapshotRequest) -> dict:
    """The Engram server's correlation id, echoed when the request gave one."""
    return {} if body.request_id is None else {"request_id": body.request_id}


def _required_session(name: str | None) -> str:
    if name is None:
        raise UsageError("give the session (or conversation_id) to snapshot.")
    return name


def _snapshot(d, sid: str) -> Snapshot:
    return Snapshot.from_record(d.store.info(sid))


def _restored(r: RestoredState) -> Restored:
    """The service's answer to a restore that generated nothing, as it goes on the wire."""
    return Restored(
        session=r.session,
        snapshot_id=r.snapshot_id,
        tokens=r.tokens,
        tier=r.origin.tier,
        restore_ms=r.origin.restore_ms,
        n_messages=r.n_messages,
    )
