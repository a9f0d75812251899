"""The ASGI app: one model, one store, one worker, the routes, auth, limits and error handlers.

    app = create_app(settings)                        # loads settings.model, opens the store, warms the backend
                                                      # and starts the prefetch of recent states (Daemon.start)
    app = create_app(settings, engine=e, store=s)     # tests, benchmarks: neither until app.state.daemon.start()

`app.state.daemon` is the Daemon (context.py); `serve` (runner.py) runs the app under uvicorn.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse
from starlette.routing import Match

from engramctl import __version__
from engramctl.daemon import routes_agent, routes_completions, routes_ollama, routes_openai, routes_status
from engramctl.daemon.auth import OLLAMA_PATHS, PUBLIC_PATHS, AuthMiddleware, check_open_routes
from engramctl.daemon.context import Daemon, engine_plan_args
from engramctl.daemon.engram_api import answers
from engramctl.daemon.engram_api import routes as engram_api_routes
from engramctl.daemon.errors import INVALID_REQUEST, body_for, error_body, validation_problem
from engramctl.daemon.limits import MAX_BODY_BYTES, BodyLimitMiddleware, JsonContentTypeMiddleware, RetryAfterMiddleware
from engramctl.daemon.model import load_model
from engramctl.daemon.schemas import ERROR_BODY_SCHEMA
from engramctl.engine.engine import Engine
from engramctl.errors import EngramError, UsageError
from engramctl.settings import Settings
from engramctl.store.store import Store
from engramctl.tiers.planner import TierPlanner

log = logging.getLogger("engramctl.daemon")


def _load(settings: Settings) -> tuple[Engine, Store, TierPlanner]:
    store = Store.open(settings)
    try:
        tiers = TierPlanner.start(settings, store.retention)  # a lowered disk budget applies from the start
        engine = load_model(settings, place_tables=tiers.claim_tables)  # the same budgets hold its N-gram tables
        tiers.replan(0, **engine_plan_args(settings, engine))  # the weights show in the figures now
    except BaseException:
        store.close()
        raise
    return engine, store, tiers


def create_app(
    settings: Settings,
    engine: Engine | None = None,
    store: Store | None = None,
    *,
    reuse: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The daemon's ASGI app. Without engine/store it loads settings.model and opens the store now.
    The app owns the store from here on: its lifespan shutdown (or app.state.daemon.close()) closes it.
    The tier plan the store follows is the daemon's (Daemon.tiers)."""
    check_open_routes(settings)
    tiers = None
    loaded = engine is None or store is None
    if loaded:
        if store is not None or engine is not None:
            raise UsageError("create_app needs both engine and store, or neither.")
        engine, store, tiers = _load(settings)
    daemon = Daemon(settings, engine, store, tiers, reuse=reuse)
    if loaded:  # a daemon of its own: warmed before it is ready, its recent states loading (Daemon.start)
        try:
            daemon.start()
        except BaseException:
            daemon.close()
            raise
    open_paths = OLLAMA_PATHS if settings.ollama_no_token else frozenset()

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        daemon.close()

    # /openapi.json documents every route; like every route but /health it needs the token (auth.py).
    app = FastAPI(title="engramctl", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.daemon = daemon
    app.include_router(routes_status.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_completions.router)
    app.include_router(routes_ollama.router)
    app.include_router(engram_api_routes.router)
    app.include_router(routes_agent.router)
    _install_error_handlers(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    # add_middleware wraps: the last added runs first. On the way in: size cap, auth, content type.
    app.add_middleware(JsonContentTypeMiddleware)
    app.add_middleware(AuthMiddleware, token=daemon.token, loopback_paths=open_paths)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body_bytes)
    app.add_middleware(RetryAfterMiddleware)  # outermost: a 429 from anywhere says when to retry
    return app


def _install_error_handlers(app: FastAPI) -> None:
    # Every failure is an ErrorBody; on the Engram routes it also carries their success/message (engram_api/answers.py).
    def answer(request: Request, status: int, body: dict, headers=None) -> JSONResponse:
        return JSONResponse(answers.failure(request.url.path, body), status_code=status, headers=headers)

    @app.exception_handler(EngramError)
    async def _engram(request: Request, exc: EngramError):
        status, body = body_for(exc)
        if status >= 500:
            log.error("request failed: %s", exc.message)
        return answer(request, status, body)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = validation_problem(list(exc.errors()))
        return answer(request, 400, error_body(message, 400, INVALID_REQUEST, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}."
        elif isinstance(exc.__cause__, UnicodeDecodeError):  # FastAPI read a body that is not UTF-8
            detail, code = "the request body is not valid JSON: it is not UTF-8 text.", INVALID_REQUEST
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            # Starlette's Allow names only the first route of the path; a path may have one route per method
            allowed = _allowed_methods(request)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            detail = f"{request.method} is not allowed on {request.url.path}; use {' or '.join(allowed)}."
        return answer(request, exc.status_code, error_body(detail, exc.status_code, code), headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error")
        status, body = body_for(exc)
        return answer(request, status, body)


def _allowed_methods(request: Request) -> list[str]:
    # Asked of the routes themselves (route.matches): included routers hide their routes' paths and methods
    allowed = []
    for method in ("DELETE", "GET", "PATCH", "POST", "PUT"):
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.routes):
            allowed.append(method)
    return allowed


_OPENAPI_DESCRIPTION = """engramctl's daemon: OpenAI-compatible chat and completions, Ollama's API, the Engram snapshot
routes, sessions, agent tools. Every route but GET /health needs `Authorization: Bearer <token>` (the Ollama
routes /api/* too, unless the ollama_no_token setting lets loopback clients use them without it). Every
failure answers a non-2xx status with the ErrorBody JSON. Not in this document (OpenAPI cannot describe it):
the WebSocket `/v1/agent/ws`, whose messages are documented in engramctl/daemon/agent_socket.py."""


def _openapi(app: FastAPI) -> dict:
    """FastAPI's document, corrected where it would not say what the daemon does: validation failures are
    400 ErrorBody (never 422 HTTPValidationError), every route may fail with an ErrorBody (auth, size cap,
    queue, store), and the bearer token is required everywhere but /health."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    doc = get_openapi(title=app.title, version=app.version, description=_OPENAPI_DESCRIPTION, routes=app.routes)
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    schemas["ErrorBody"] = ERROR_BODY_SCHEMA
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    doc["security"] = [{"bearer": []}]
    failure = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
    for path, operations in doc.get("paths", {}).items():
        for op in operations.values():
            responses = op.setdefault("responses", {})
            responses.pop("422", None)
            if path in PUBLIC_PATHS:
                op["security"] = []
                continue
            responses["4XX"] = {
                "description": "Refused: bad input, missing token, not found, conflict, busy.",
                **failure,
            }
            responses["5XX"] = {"description": "The daemon could not do it (store closed, shutting down).", **failure}
    app.openapi_schema = doc
    return doc
