"""Errors on the wire: which HTTP status each typed error gets, the JSON body every failure has
(protocol.ErrorBody), and pydantic's validation errors as one sentence.

`type` is OpenAI's coarse class, `code` the precise `EngramError.kind`, which the client maps back to
the same exception class. No fastapi or pydantic import here, so the client may import this module.
"""

from __future__ import annotations

from typing import Any

from engramctl.errors import (
    Cancelled,
    ContextOverflow,
    EngramError,
    ModelNotFound,
    NotFound,
    SnapshotError,
    UnsupportedModel,
    UsageError,
)
from engramctl.protocol import ErrorBody

__all__ = ["Cancelled"]  # re-exported: the daemon and client import it from here


class QueueFull(EngramError):
    """More generation requests are waiting than the daemon's queue holds."""

    kind = "queue_full"


class ShuttingDown(EngramError):
    kind = "shutting_down"


class AuthenticationFailed(EngramError):
    """The daemon refused the token (exit code 1, like any other error)."""

    kind = "authentication_error"


class RequestTooLarge(UsageError):
    kind = "request_too_large"


# kind -> HTTP status where the class alone does not decide it
_STATUS_BY_KIND = {
    "snapshot_in_use": 409,
    "already_exists": 409,
    "store_locked": 503,
    "store_closed": 503,
}


def status_for(exc: BaseException) -> int:
    kind = getattr(exc, "kind", None)
    if kind in _STATUS_BY_KIND:
        return _STATUS_BY_KIND[kind]
    if isinstance(exc, AuthenticationFailed):
        return 401
    if isinstance(exc, RequestTooLarge):
        return 413
    if isinstance(exc, QueueFull):
        return 429
    if isinstance(exc, (ShuttingDown,)):
        return 503
    if isinstance(exc, Cancelled):
        return 499  # nginx's "client closed request"; nobody is there to read it
    if isinstance(exc, (NotFound, ModelNotFound)):
        return 404
    if isinstance(exc, ContextOverflow):
        return 400
    if isinstance(exc, SnapshotError):
        return 409  # intact store, but this snapshot cannot be used with the loaded model
    if isinstance(exc, UsageError):
        return 400
    if isinstance(exc, UnsupportedModel):
        return 400
    return 500


def error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(
    message: str, status: int, code: str | None = None, hint: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return ErrorBody(message, error_type(status), code, param, hint).to_json()


def body_for(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) for an exception; unexpected ones get a generic 500 message."""
    status = status_for(exc)
    if isinstance(exc, EngramError):
        return status, error_body(exc.message, status, exc.kind, exc.hint)
    return status, error_body(f"internal error: {type(exc).__name__}: {exc}", status, "internal_error")


def validation_problem(errors: list[dict[str, Any]], where: str = "") -> tuple[str, str | None]:
    """pydantic's `errors()` as (one sentence, the field it names): the first problem, and how many more.
    `where` prefixes the field (e.g. "messages[0]"); a location starting at the request body drops "body"."""
    if not errors:
        return "invalid request.", where or None
    e = errors[0]
    if e.get("type") == "json_invalid":
        detail = (e.get("ctx") or {}).get("error", "")
        return f"the request body is not valid JSON{f' ({detail})' if detail else ''}.", None
    loc = [p for p in e.get("loc", ()) if p != "body"]
    if not loc and not where:
        if e.get("type") == "missing":
            return "the request needs a JSON object body.", None
        if e.get("type") in ("model_attributes_type", "dict_type", "model_type"):
            return "the request body must be a JSON object.", None
    for part in loc:
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return (f"{where}: {msg}{more}" if where else f"{msg}{more}"), where or None
