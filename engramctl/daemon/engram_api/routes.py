"""The Engram API's routes: the original Engram server's five snapshot routes (POST + JSON bodies;
`conversation_id`, `rid` and `session` name the same thing), plus /branch_snapshot and the management
routes the CLI needs while the daemon owns the store: /pin_snapshot, /unpin_snapshot,
/label_snapshot, /get_snapshot_transcript, /gc_snapshots, /import_snapshot (raw file body).

The five routes also take that server's own fields: the turn_number / branch_name selectors, a custom
snapshot_id, and restore-and-generate (continuation_ids, max_new_tokens: continuation.py); its names for
snapshots are read and written by naming.py over the store's name table. The work runs on the worker
through the conversation service the OpenAI routes use (restore.py: restore and save). docs/engram-api.md
says what each does and where we differ. Answers are protocol objects (Snapshot, Session, Restored) in their
terms (answers.py)."""

from __future__ import annotations

from typing import Annotated, Any, Callable

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from engramctl.daemon import session_changes
from engramctl.daemon.bulk_json import bulk_json
from engramctl.daemon.context import daemon_of
from engramctl.daemon.engram_api import answers, naming, restore
from engramctl.daemon.engram_api.continuation import token_turn
from engramctl.daemon.engram_api.schemas import (
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
from engramctl.daemon.streaming import Completion, answer_turn, job_result
from engramctl.daemon.turn_json import engram_json, finish_reason, usage_json
from engramctl.daemon.turn_result import TurnResult
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
        return naming.save(
            d.service,
            d.store,
            name,
            body.label,
            body.pin,
            turn_number=body.turn_number,
            branch_name=body.branch_name,
            snapshot_id=body.snapshot_id,
        )

    job = d.worker.submit(run, name="save_snapshot", session=name)  # after a reply being generated: its state
    sid, branch = await job_result(job, request)
    await run_in_threadpool(d.store.snapshots.wait_durable, sid, SAVE_DURABLE_S)  # saved means on disk (their contract)
    snap = naming.snapshot(d.store, sid)
    if not body.engram:
        return answers.snapshot(snap)
    turn = body.turn_number if body.turn_number is not None else naming.names_of(d.store, [snap])[0].get(snap.id)
    conversation = body.conversation or name
    their_id = body.snapshot_id or f"{conversation}-t{turn or 0}"
    meta = answers.Meta(conversation, turn, body.branch_name, their_id)
    return answers.saved(snap, their_id, meta, **({"branch_session": branch} if branch else {}))


@router.post("/restore_snapshot")
async def restore_snapshot(body: RestoreSnapshotRequest, request: Request):
    """Restore a snapshot (by id or name, a conversation's head, turn_number or branch_name; a conversation
    named in their terms alone, by conversation_id or rid: what it saved last, else its head); with a
    continuation message answer a chat completion, with continuation_ids (token ids) the Engram server's
    restore-and-generate answer."""
    d = daemon_of(request)  # body.model: any name means the served model (routes_openai)
    continuation, ids = body.continuation_message(), body.continuation_ids
    params = body.params()
    ref, session, conversation = body.snapshot_id, body.session_name, body.conversation
    if body.branch_name is not None:  # the branch's own session, at its head: a turn continues the branch
        session = naming.branch_session(d.store, body)
    elif body.turn_number is not None:
        ref = naming.turn_snapshot(d.store, body)
    elif ref is None and body.session is None:  # a conversation in their terms: back to what it saved
        ref = naming.restore_point(d.store, session)

    def run(job):
        then = None if ids is None else token_turn(d.service, ids, params, job)
        idle = session_changes.restore_check(d)
        out = restore.restore(d.service, ref, session, continuation, params, job, then=then, idle=idle)
        if isinstance(out, Restored):
            r = out
            extra = {"rid": answers.new_rid()} if body.create_new_request else {}
            if r.snapshot_id is not None:  # a branch's turns are named after its own session
                label = conversation if body.branch_name is None else None
                meta = naming.meta(
                    d.store, r.snapshot_id, conversation, scope=r.session, label=label, branch=body.branch_name
                )
                extra |= {"turn_number": meta.turn_number, "branch_name": meta.branch_name, "name": meta.name}
            if conversation is not None:
                extra["conversation_id"] = conversation
            return answers.restored(r, **extra, **_request_id(body))
        if ids is None:
            return out
        out.answer = lambda r: _generated(d, r, ids, conversation, body)
        return out

    # with a continuation it is a turn (the scheduler runs it); a restore alone runs between steps
    turn = continuation is not None or ids is not None
    job = d.worker.submit(run, name="restore_snapshot", turn=turn, session=session if turn else None)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = body.stream and continuation is not None
    return await answer_turn(job, request, Completion(d.model_id, d.engine.info.fingerprint), stream, include_usage)


@router.get("/list_snapshots")
async def list_snapshots_get(query: Annotated[ListSnapshotsRequest, Query()], request: Request):
    """All snapshots, or one session's (?session=NAME), oldest first; ?conversation_id=NAME lists one
    conversation as the Engram server does (see the POST route)."""
    return bulk_json(await run_in_threadpool(_list, request, query))


@router.post("/list_snapshots")
async def list_snapshots(request: Request, body: ListSnapshotsRequest | None = None):
    """All snapshots, or one session's, oldest first. The body may be left out (lists everything).
    Named by conversation_id, a conversation is listed as the Engram server lists it: its turns by
    turn_number, then its branches by name; an unknown conversation is an empty list."""
    return bulk_json(await run_in_threadpool(_list, request, body or ListSnapshotsRequest()))


def _list(request: Request, body: ListSnapshotsRequest) -> dict:
    """The listing, read a piece at a time: what another request deletes meanwhile is left out, not a 404."""
    d = daemon_of(request)
    name = body.session_name
    if not body.engram:
        snaps = [Snapshot.from_record(r) for r in d.store.snapshots.list(name)]
        turns, names = naming.names_of(d.store, snaps)
        return answers.snapshots(
            [answers.item(s, answers.Meta(s.session, turns.get(s.id), None, names.get(s.id))) for s in snaps]
        )
    conversation = body.conversation
    if not d.store.sessions.has(name):
        return answers.snapshots([])
    turns = _unless_gone(d.store.names.turns, name) or {}
    custom = d.store.names.custom_ids(turns.values())
    items = [_unless_gone(_turn_item, d.store, conversation, n, sid, custom) for n, sid in turns.items()]
    branches = d.store.names.branches(name).items()
    items += [_unless_gone(_branch_item, d.store, conversation, branch, session) for branch, session in branches]
    return answers.snapshots([i for i in items if i is not None])


def _turn_item(store, conversation: str | None, n: int, sid: str, custom: dict[str, str]) -> dict:
    return answers.item(
        naming.snapshot(store, sid), answers.Meta(conversation, n, None, custom.get(sid) or f"{conversation}-t{n}")
    )


def _branch_item(store, conversation: str | None, branch: str, branch_session: str) -> dict | None:
    head = store.sessions.get(branch_session).head
    if head is None:
        return None
    meta = naming.meta(store, head, conversation, scope=branch_session, branch=branch)
    return answers.item(naming.snapshot(store, head), meta)


def _unless_gone(read: Callable[..., Any], *args: Any) -> Any:
    try:
        return read(*args)
    except NotFound:
        return None


@router.post("/get_snapshot_info")
async def get_snapshot_info(body: SnapshotInfoRequest, request: Request):
    """One snapshot (id or name), a conversation's head, or the Engram server's turn_number / branch_name
    of a conversation; its metadata in their terms under `metadata` (with fill_ids: the token ids)."""
    d = daemon_of(request)
    if body.snapshot_id is not None:
        sid = d.store.resolve(body.snapshot_id)
    elif body.branch_name is not None:
        sid = naming.head(d.store, naming.branch_session(d.store, body), body)
    elif body.turn_number is not None:
        sid = naming.turn_snapshot(d.store, body)
    else:
        sid = naming.head(d.store, body.session_name, body)
    snap = naming.snapshot(d.store, sid)
    if body.branch_name is not None and body.snapshot_id is None:
        scope = naming.branch_session(d.store, body)
        meta = naming.meta(d.store, sid, body.conversation, scope=scope, branch=body.branch_name)
    else:
        meta = naming.meta(d.store, sid, body.conversation, scope=body.session_name, label=body.conversation)
    metadata = {**meta.of(snap), "fill_ids": await run_in_threadpool(d.store.snapshots.token_ids, sid)}
    return answers.snapshot(snap, meta, metadata=metadata)


@router.post("/delete_snapshot")
async def delete_snapshot(body: DeleteSnapshotRequest, request: Request):
    """One snapshot (id or name; a head, branch point or pinned one needs force), or the Engram server's
    turn_number of a conversation (force by default, as their delete is), or a branch_name: the branch's
    session goes, as DELETE /v1/sessions/{name} would."""
    d = daemon_of(request)
    if body.branch_name is not None:
        name = naming.branch_session(d.store, body)
        job = d.worker.submit(lambda job: session_changes.delete(d, name), name="delete_snapshot")
        deleted = await job_result(job, request)
        return answers.ok(
            message="Snapshot deleted successfully",
            conversation_id=body.conversation,
            branch_name=body.branch_name,
            session=name,
            deleted=deleted,
        )
    if body.snapshot_id is not None:
        sid = d.store.resolve(body.snapshot_id)
        job = d.worker.submit(lambda job: session_changes.delete_snapshot(d, sid, bool(body.force)), name="delete")
        await job_result(job, request)
        ours = is_id_prefix(body.snapshot_id.strip().lower()) and not body.given("conversation_id", *ENGRAM_FIELDS)
        if ours:
            return answers.ok(snapshot_id=sid)
        return answers.ok(snapshot_id=sid, message="Snapshot deleted successfully")
    sid = naming.turn_snapshot(d.store, body)
    force = True if body.force is None else body.force
    await job_result(
        d.worker.submit(lambda job: session_changes.delete_snapshot(d, sid, force), name="delete"), request
    )
    return answers.ok(
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
        and not d.store.sessions.has(body.source)
    ):
        source = d.store.resolve(body.source)  # an id prefix (a session by that name would win)
    elif (
        body.source is not None
        and not d.store.sessions.has(body.source)
        and d.store.names.is_snapshot_name(body.source)
    ):
        source = d.store.resolve(body.source)  # a name the Engram routes gave a snapshot (custom id, <conv>-t<N>)
    else:
        source = body.source_ref
    after = source if d.store.sessions.has(source) else None  # a session's reply being generated goes in first
    job = d.worker.submit(lambda job: d.store.sessions.branch(source, body.new_session), name="branch", session=after)
    info = await job_result(job, request)
    return answers.session(Session.from_info(info), source=source)


@router.post("/pin_snapshot")
async def pin_snapshot(body: PinSnapshotRequest, request: Request):
    """Pin any snapshot (retention never deletes it), optionally labelling it too."""
    d = daemon_of(request)
    sid = d.store.resolve(body.snapshot_id)
    if body.label is not None:
        d.store.snapshots.label(sid, body.label)
    return answers.snapshot(Snapshot.from_record(d.store.snapshots.pin(sid)))


@router.post("/unpin_snapshot")
async def unpin_snapshot(body: SnapshotRef, request: Request):
    d = daemon_of(request)
    return answers.snapshot(Snapshot.from_record(d.store.snapshots.unpin(d.store.resolve(body.snapshot_id))))


@router.post("/label_snapshot")
async def label_snapshot(body: LabelSnapshotRequest, request: Request):
    """Set (or with null, clear) a snapshot's label."""
    d = daemon_of(request)
    return answers.snapshot(
        Snapshot.from_record(d.store.snapshots.label(d.store.resolve(body.snapshot_id), body.label))
    )


@router.post("/get_snapshot_transcript")
async def get_snapshot_transcript(body: SnapshotRef, request: Request):
    """The transcript exactly as it was when the snapshot was taken (whatever its session did since)."""
    d = daemon_of(request)
    rec = d.store.snapshots.info(d.store.resolve(body.snapshot_id))
    messages = d.store.transcripts.of_snapshot(rec.id)
    return answers.ok(
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
    report = await run_in_threadpool(daemon_of(request).store.retention.gc)
    return answers.ok(**report.to_json())


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
    return answers.snapshot(Snapshot.from_record(rec), messages=n_messages)


def _generated(d, r: TurnResult, ids: list[int], conversation: str | None, body: RestoreSnapshotRequest) -> dict:
    """The answer to a restore-and-generate: the Engram server's fields, then ours (the new head's
    snapshot_id and names, usage, the `engram` turn info)."""
    out = list(r.token_ids)
    if out and r.finish_reason == "stop" and out[-1] in d.engine.tokenizer.eos_ids:
        out = out[:-1]  # as theirs: the stop token is not part of the output
    head, session = r.snapshot_id, r.session
    label = conversation if body.branch_name is None else None
    meta = None if head is None else naming.meta(d.store, head, conversation, scope=session, label=label)
    theirs = {"branch_name": body.branch_name}
    if meta is not None:
        theirs |= {"turn_number": meta.turn_number, "name": meta.name}
    return answers.generated(
        out,
        r.text,
        r.prompt_tokens - len(ids),
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
