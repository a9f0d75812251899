"""Errors on the wire: the JSON body every failure has (protocol.ErrorBody), and pydantic's validation
errors as one sentence. Each error class declares its own status and kind (engramctl/errors.py).

`type` is OpenAI's coarse class, `code` the precise `EngramError.kind`, which the client maps back to
the same exception class. No fastapi or pydantic import here, so the client may import this module.
"""

from __future__ import annotations

import re
from typing import Any

from engramctl.errors import (  # re-exported: the daemon and the client import them from here
    AuthenticationFailed,
    Cancelled,
    EngramError,
    QueueFull,
    RequestTooLarge,
    ShuttingDown,
    UsageError,
)
from engramctl.protocol import ErrorBody

__all__ = ["AuthenticationFailed", "Cancelled", "QueueFull", "RequestTooLarge", "ShuttingDown"]

# The one spelling of a malformed request's `code` (a body pydantic refuses, a UsageError): UsageError's kind,
# which the client maps back to UsageError.
INVALID_REQUEST = UsageError.kind
# A refusal's sentence starts with the field it blames ("top_logprobs: needs logprobs: true"): its `param`.
_FIELD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\]|\.[A-Za-z_][A-Za-z0-9_]*)*): ")


def field_named(message: str) -> str | None:
    """The request field a refusal's message starts with, if it starts with one."""
    m = _FIELD.match(message)
    return m.group(1) if m else None


def status_for(exc: BaseException) -> int:
    """The HTTP status of an exception: the one its class declares (engramctl.errors), else 500."""
    return exc.status if isinstance(exc, EngramError) else 500


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
        param = exc.param if exc.param is not None or status >= 500 else field_named(exc.message)
        return status, error_body(exc.message, status, exc.kind, exc.hint, param)
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
    named = field_named(msg)  # a model validator's check names its field first ("images: ...")
    if not where:
        return f"{msg}{more}", named
    return f"{where}: {msg}{more}", f"{where}.{named}" if named else where
