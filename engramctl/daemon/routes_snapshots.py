"""Snapshot routes compatible with the original Engram server (POST + JSON bodies;
`conversation_id` and `session` name the same thing), plus /branch_snapshot."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from pydantic import ValidationError

from engramctl.daemon.app import daemon_of
from engramctl.daemon.schemas import (
    BranchSnapshotRequest, DeleteSnapshotRequest, ListSnapshotsRequest, RestoreSnapshotRequest,
    SaveSnapshotRequest, SnapshotInfoRequest, session_json, snapshot_json,
)  # fmt: skip
from engramctl.daemon.streaming import Completion, answer_turn, job_result
from engramctl.errors import NotFound, UsageError
from engramctl.store.names import is_snapshot_id

router = APIRouter()
_HEX_PREFIX = re.compile(r"[0-9a-f]{4,31}")


@router.post("/save_snapshot")
async def save_snapshot(body: SaveSnapshotRequest, request: Request):
    d = daemon_of(request)
    name = _required_session(body.session_name)
    job = d.worker.submit(lambda job: d.service.save(name, body.label, body.pin), name="save_snapshot")
    sid = await job_result(job, request)
    return {"success": True, **snapshot_json(d.store.info(sid))}


@router.post("/restore_snapshot")
async def restore_snapshot(body: RestoreSnapshotRequest, request: Request):
    d = daemon_of(request)
    d.check_model(body.model)
    continuation = body.continuation_message()

    def run(job):
        return d.service.restore(body.snapshot_id, body.session_name, continuation, body, job.emit, job.cancel)

    job = d.worker.submit(run, name="restore_snapshot")
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    stream = body.stream and continuation is not None
    return await answer_turn(job, request, Completion(d.model_id, d.engine.info.fingerprint), stream, include_usage)


@router.api_route("/list_snapshots", methods=["GET", "POST"])
async def list_snapshots(request: Request):
    body = await _optional_body(request, ListSnapshotsRequest)
    d = daemon_of(request)
    records = d.store.list(body.session_name)
    return {"success": True, "snapshots": [snapshot_json(r) for r in records]}


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
    return {"success": True, **snapshot_json(d.store.info(sid))}


@router.post("/delete_snapshot")
async def delete_snapshot(body: DeleteSnapshotRequest, request: Request):
    d = daemon_of(request)
    sid = d.store.resolve(body.snapshot_id)
    d.store.delete(sid, force=body.force)
    return {"success": True, "snapshot_id": sid}


@router.post("/branch_snapshot")
async def branch_snapshot(body: BranchSnapshotRequest, request: Request):
    d = daemon_of(request)
    if body.snapshot_id is not None:
        source = d.store.resolve(body.snapshot_id)
    elif body.source is not None and _HEX_PREFIX.fullmatch(body.source) and not is_snapshot_id(body.source) \
            and not _session_exists(d, body.source):
        source = d.store.resolve(body.source)  # an id prefix (a session by that name would win)
    else:
        source = body.source_ref
    info = d.store.branch(source, body.new_session)
    return {"success": True, "source": source, **session_json(info)}


def _required_session(name: str | None) -> str:
    if name is None:
        raise UsageError("give the session (or conversation_id) to snapshot.")
    return name


def _session_exists(d, name: str) -> bool:
    try:
        d.store.get_session(name)
        return True
    except (NotFound, UsageError):
        return False


async def _optional_body(request: Request, model):
    """A JSON body that may be absent (GET, or POST with nothing)."""
    raw = await request.body()
    if request.method == "GET":
        data = dict(request.query_params)
    elif not raw.strip():
        data = {}
    else:
        import json

        try:
            data = json.loads(raw)
        except json.JSONDecodeError as e:
            raise UsageError(f"the request body is not valid JSON ({e.msg}).") from None
        if not isinstance(data, dict):
            raise UsageError("the request body must be a JSON object.")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        raise UsageError(f"{loc}: {msg}" if loc else msg) from None
