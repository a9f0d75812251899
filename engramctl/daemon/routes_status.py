"""Daemon routes for people and the CLI: /health (no auth), /v1/status, /v1/sessions (list, show,
delete, reset), /v1/tiers, /v1/snapshots/freed_bytes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.concurrency import run_in_threadpool

from engramctl import __version__
from engramctl.daemon import session_changes
from engramctl.daemon.bulk_json import bulk_json
from engramctl.daemon.context import daemon_of
from engramctl.daemon.schemas import FreedBytesRequest
from engramctl.daemon.streaming import job_result
from engramctl.protocol import Session
from engramctl.store.names import validate_session_name

router = APIRouter()
# documentation only: validate_session_name checks it, with a message that names the rule
SessionName = Annotated[str, Path(json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,64}$"})]


@router.get("/health")
async def health(request: Request):
    d = daemon_of(request)
    return {"status": "ok", "model": d.model_id, "version": __version__}


def _model(d) -> dict:
    """What serves the requests: the backend, how its weights are held and what they take in memory."""
    i = d.engine.info
    return {
        "model": d.model_id,
        "backend": i.backend,
        "weight_type": i.weight_type or i.dtype,
        "device": i.device,
        "dtype": i.dtype,
        "weights_bytes": i.weights_bytes,
        "build": i.build,  # which llama.cpp (CPU, or CUDA and its architectures) or torch computes
    }


@router.get("/v1/status")
async def status(request: Request):
    d = daemon_of(request)
    server = request.scope.get("server") or (None, None)
    return {**d.status(), **_model(d), "notices": list(d.engine.notices), "host": server[0], "port": server[1]}


@router.get("/v1/tiers")
async def tiers(request: Request):
    """The tier plan, the model whose weights share the memory with the hot tiers, how many
    conversations it serves at once (each resident one holds a state in memory) and which of its layers
    run on the GPU (`offload`, llama.cpp: tiers/offload.py; null on transformers)."""
    d = daemon_of(request)
    prefixes = {**d.store.prefixes.usage_json(), **d.service.prefixes.counts()}
    offload = d.engine.offload  # None: the backend runs the whole model on one device (transformers)
    return {
        **d.tiers.plan_json(),
        "model": _model(d),
        "serving": d.serving(),
        "prefix_states": prefixes,
        "offload": None if offload is None else offload.to_json(),
        "device_copies": d.engine.device_copies(),  # llama.cpp's VRAM tier; null on transformers
    }


@router.get("/v1/sessions")
async def sessions(request: Request):
    d = daemon_of(request)
    hot = d.service.hot
    # off the event loop: at a thousand sessions the query takes ~0.1 s that streams would wait through
    listed = await run_in_threadpool(d.store.sessions.list)
    on = [{**Session.from_info(s).to_json(), "hot": hot is not None and hot.session == s.name} for s in listed]
    return bulk_json({"sessions": on})


@router.get("/v1/sessions/{name}")
async def session(name: SessionName, request: Request):
    d = daemon_of(request)
    info = d.store.sessions.get(validate_session_name(name))
    return {**Session.from_info(info).to_json(), "messages": d.store.transcripts.of_session(name)}


@router.delete("/v1/sessions/{name}")
async def delete_session(name: SessionName, request: Request):
    """Delete the session, its snapshots and names; 409 while a turn of it runs (session_changes.py)."""
    d = daemon_of(request)
    validate_session_name(name)
    deleted = await job_result(
        d.worker.submit(lambda job: session_changes.delete(d, name), name="delete_session"), request
    )
    return {"success": True, "session": name, "deleted_snapshots": deleted}


@router.post("/v1/sessions/{name}/reset")
async def reset_session(name: SessionName, request: Request):
    """Start the session over (the REPL's /clear, `chat --new`): no state, an empty transcript. Nothing
    is deleted: its snapshots stay listed, each with the transcript it was taken at. 409 while a turn of it
    runs (session_changes.py)."""
    d = daemon_of(request)
    validate_session_name(name)
    job = d.worker.submit(lambda job: session_changes.reset(d, name), name="reset_session")
    previous, info = await job_result(job, request)
    return {"success": True, **Session.from_info(info).to_json(), "previous_head": previous}


@router.post("/v1/snapshots/freed_bytes")
async def freed_bytes(body: FreedBytesRequest, request: Request):
    """What deleting these snapshots together would free on disk (their files and the KV blocks only they
    use): a snapshot's own size counts blocks it shares, so their sum says too much. 404 names an unknown id."""
    d = daemon_of(request)
    return {"snapshot_ids": body.snapshot_ids, "freed_bytes": d.store.snapshots.freed_bytes(body.snapshot_ids)}
