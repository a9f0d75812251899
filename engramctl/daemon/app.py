"""The ASGI app: one model, one store, one worker, the routes, auth, limits and error handlers.

    app = create_app(settings)                        # loads settings.model, opens the store
    app = create_app(settings, engine=e, store=s)     # tests, benchmarks, `serve`

`app.state.daemon` is the Daemon below; `serve` (runner.py) runs the app under uvicorn.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from engramctl import __version__
from engramctl.daemon.auth import AuthMiddleware, ensure_token
from engramctl.daemon.errors import body_for, error_body
from engramctl.daemon.limits import MAX_BODY_BYTES, BodyLimitMiddleware, JsonContentTypeMiddleware
from engramctl.daemon.service import ConversationService
from engramctl.daemon.worker import Worker
from engramctl.engine.engine import Engine
from engramctl.errors import EngramError, ModelNotFound, UsageError
from engramctl.settings import Settings
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")


class Daemon:
    """Everything a route needs, owned for the app's lifetime."""

    def __init__(self, settings: Settings, engine: Engine, store: Store, *, token: str | None = None, reuse: bool = True):
        self.settings, self.engine, self.store = settings, engine, store
        self.token = token or ensure_token(settings)
        self.service = ConversationService(engine, store, reuse=reuse)
        self.worker = Worker(settings.max_queue)
        self.started = time.time()
        self.model_id = engine.info.model_id
        aliases = {"default", self.model_id, Path(self.model_id).name}
        if settings.model:
            aliases |= {settings.model, Path(settings.model).name}
        self.model_aliases = frozenset(a for a in aliases if a)
        self._closed = False

    def check_model(self, name: str) -> None:
        if name not in self.model_aliases:
            raise ModelNotFound(
                f"the model {name!r} does not exist; this daemon serves {self.model_id!r} (or use 'default').",
                hint="GET /v1/models lists it",
            )

    def begin_shutdown(self) -> None:
        """Refuse new work, cancel the generation in flight and everything queued."""
        self.worker.begin_shutdown()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker (cancelling what runs), write pending snapshots, close the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.worker.close(timeout):
            log.warning("the generation in flight did not stop within %.0f s; closing anyway", timeout)
        if not self.store.flush(timeout=max(timeout, 10.0)):
            log.warning("some snapshot writes did not finish in time")
        self.store.close()

    def status(self) -> dict[str, Any]:
        info = self.engine.info
        hot = self.service.hot
        try:
            import psutil

            rss = psutil.Process().memory_info().rss
        except Exception:  # noqa: BLE001
            rss = None
        return {
            "status": "ok",
            "version": __version__,
            "pid": os.getpid(),
            "model": self.model_id,
            "family": info.family,
            "architecture": info.architecture,
            "device": info.device,
            "dtype": info.dtype,
            "context_length": info.context_length,
            "weights_bytes": info.weights_bytes,
            "n_params": info.n_params,
            "fingerprint": info.fingerprint,
            "started": self.started,
            "uptime_s": round(time.time() - self.started, 3),
            "rss_bytes": rss,
            "sessions": len(self.store.list_sessions()),
            "hot": None if hot is None else {"session": hot.session, "snapshot_id": hot.head,
                                             "tokens": len(hot.live.token_ids)},  # fmt: skip
            "queue": {"busy": self.worker.busy, "waiting": self.worker.waiting, "max": self.worker.max_queue},
            "turns": self.service.turns,
            "pending_writes": self.store.pending_writes,
            "write_errors": list(self.store.write_errors),
        }


def daemon_of(request: Request) -> Daemon:
    return request.app.state.daemon


def _load(settings: Settings) -> tuple[Engine, Store]:
    from engramctl.daemon.runner import load_model

    store = Store.open(settings)
    try:
        engine = load_model(settings)
        store.replan(model_bytes=0, model_on_cpu=engine.info.device == "cpu")
    except BaseException:
        store.close()
        raise
    return engine, store


def create_app(settings: Settings, engine: Engine | None = None, store: Store | None = None, *,
               reuse: bool = True, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:  # fmt: skip
    """The daemon's ASGI app. Without engine/store it loads settings.model and opens the store now.
    The app owns the store from here on: its lifespan shutdown (or app.state.daemon.close()) closes it."""
    from engramctl.daemon import routes_agent, routes_openai, routes_snapshots, routes_status

    if engine is None or store is None:
        if store is not None or engine is not None:
            raise UsageError("create_app needs both engine and store, or neither.")
        engine, store = _load(settings)
    daemon = Daemon(settings, engine, store, reuse=reuse)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        daemon.close()

    app = FastAPI(title="engramctl", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # fmt: skip
    app.state.daemon = daemon
    app.include_router(routes_status.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_snapshots.router)
    app.include_router(routes_agent.router)
    _install_error_handlers(app)
    # add_middleware wraps: the last added runs first. On the way in: size cap, auth, content type.
    app.add_middleware(JsonContentTypeMiddleware)
    app.add_middleware(AuthMiddleware, token=daemon.token)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    return app


def _validation_message(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request."
    e = errors[0]
    if e.get("type") == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{f' ({detail})' if detail else ''}."
    loc = [p for p in e.get("loc", ()) if p != "body"]
    if e.get("type") == "missing" and not loc:
        return "the request needs a JSON object body."
    if not loc and e.get("type") in ("model_attributes_type", "dict_type", "model_type"):
        return "the request body must be a JSON object."
    where = ""
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(EngramError)
    async def _engram(_request: Request, exc: EngramError):
        status, body = body_for(exc)
        if status >= 500:
            log.error("request failed: %s", exc.message)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        return JSONResponse(error_body(_validation_message(exc), 400, "invalid_request"), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {_request.method} {_request.url.path}."
        return JSONResponse(error_body(detail, exc.status_code, code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))  # fmt: skip

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception):
        log.exception("unexpected error")
        status, body = body_for(exc)
        return JSONResponse(body, status_code=status)
