"""Daemon routes for people and the CLI: /health (no auth), /v1/status, /v1/sessions (list, show,
delete, reset), /v1/tiers."""

from __future__ import annotations

from fastapi import APIRouter, Request

from engramctl import __version__
from engramctl.daemon.app import daemon_of
from engramctl.daemon.schemas import session_json
from engramctl.daemon.streaming import job_result
from engramctl.store.names import validate_session_name

router = APIRouter()


@router.get("/health")
async def health(request: Request):
    d = daemon_of(request)
    return {"status": "ok", "model": d.model_id, "version": __version__}


@router.get("/v1/status")
async def status(request: Request):
    d = daemon_of(request)
    server = request.scope.get("server") or (None, None)
    return {**d.status(), "notices": list(d.engine.notices), "host": server[0], "port": server[1]}


@router.get("/v1/tiers")
async def tiers(request: Request):
    return daemon_of(request).store.plan_json()


@router.get("/v1/sessions")
async def sessions(request: Request):
    d = daemon_of(request)
    hot = d.service.hot
    return {"sessions": [{**session_json(s), "hot": hot is not None and hot.session == s.name}
                         for s in d.store.list_sessions()]}  # fmt: skip


@router.get("/v1/sessions/{name}")
async def session(name: str, request: Request):
    d = daemon_of(request)
    info = d.store.get_session(validate_session_name(name))
    return {**session_json(info), "messages": d.store.transcript(name)}


@router.delete("/v1/sessions/{name}")
async def delete_session(name: str, request: Request):
    d = daemon_of(request)
    deleted = d.store.delete_session(validate_session_name(name))
    d.service.invalidate(name)
    return {"success": True, "session": name, "deleted_snapshots": deleted}


@router.post("/v1/sessions/{name}/reset")
async def reset_session(name: str, request: Request):
    """Start the session over (the REPL's /clear, `chat --new`): no state, an empty transcript. Nothing
    is deleted: its snapshots stay listed, each with the transcript it was taken at."""
    d = daemon_of(request)
    validate_session_name(name)
    job = d.worker.submit(lambda job: d.service.reset(name), name="reset_session")  # not in the middle of a turn
    previous, info = await job_result(job, request)
    return {"success": True, **session_json(info), "previous_head": previous}
