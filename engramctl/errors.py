"""Every typed error engramctl raises on purpose, in one place.

Each class declares, once, its `kind` (the precise reason: the error body's `code` on the wire) and the
HTTP `status` the daemon answers with (a subclass inherits both unless it says otherwise). Defining a
class with a `kind` registers it, so the client turns an error body back into the very class the daemon
raised (`EngramError.for_kind`). Each error carries a sentence for the user and, where there is one, the
next command to try (`hint`).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing: `snapshots ls` imports none of it (~4% of its time)
if TYPE_CHECKING:
    from typing import ClassVar


class EngramError(Exception):
    """Base of every error engramctl raises on purpose."""

    exit_code = 1
    kind = "engram_error"
    status = 500
    param: str | None = None  # the request field it is about, where there is one
    _by_kind: ClassVar[dict[str, type["EngramError"]]] = {}

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" not in cls.__dict__:
            return  # a refinement of its parent's reason (daemon/streaming.py's ClientGone): not on the wire
        known = EngramError._by_kind.get(cls.kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(f"error kind {cls.kind!r} already names {known.__qualname__}")
        EngramError._by_kind[cls.kind] = cls

    @classmethod
    def from_wire(cls, message: str, hint: str | None = None, param: str | None = None) -> "EngramError":
        """The error again from what crossed the wire (protocol.ErrorBody's message, hint and param)."""
        exc = cls(message, hint)
        if param is not None:
            exc.param = param
        return exc

    @staticmethod
    def for_kind(kind: str | None) -> type["EngramError"] | None:
        """The class that declared `kind` (None for an unknown one)."""
        return EngramError._by_kind.get(kind) if kind else None

    @staticmethod
    def kinds() -> dict[str, type["EngramError"]]:
        return dict(EngramError._by_kind)


EngramError._by_kind[EngramError.kind] = EngramError


# -- the request ---------------------------------------------------------------------------------------------
class UsageError(EngramError):
    exit_code = 2
    kind = "invalid_request_error"
    status = 400


class InvalidName(UsageError):
    kind = "invalid_name"


class ContextOverflow(UsageError):
    kind = "context_length_exceeded"


class RequestTooLarge(UsageError):
    kind = "request_too_large"
    status = 413


class ToolArgumentError(UsageError):
    """A tool's arguments do not match its schema; `param` names the field."""

    kind = "invalid_arguments"

    def __init__(self, message: str, param: str | None = None, hint: str | None = None):
        super().__init__(message, hint)
        self.param = param

    @classmethod
    def from_wire(cls, message: str, hint: str | None = None, param: str | None = None) -> "ToolArgumentError":
        return cls(message, param, hint)


class UnsupportedSchema(UsageError):
    """A structured-output schema (response_format, Ollama's format) the grammar cannot enforce; the message
    names the JSON Schema feature, `param` the request field. Refused before anything is generated."""

    kind = "unsupported_schema"


class UnknownTool(UsageError):
    kind = "unknown_tool"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message, hint)
        self.param = "tool"


class NotFound(EngramError):
    kind = "not_found"
    status = 404


class AuthenticationFailed(EngramError):
    """The daemon refused the token (exit code 1, like any other error)."""

    kind = "authentication_error"
    status = 401


# -- the model and its backend -------------------------------------------------------------------------------
class ModelNotFound(EngramError):
    kind = "model_not_found"
    status = 404


class UnsupportedModel(EngramError):
    kind = "unsupported_model"
    status = 400


class StateFormatError(UnsupportedModel):
    """A backend's native state does not have the layout engramctl parses (a newer llama.cpp, say)."""

    kind = "state_format_error"


class BackendUnavailable(EngramError):
    """The chosen inference backend is not installed or cannot load (llama-cpp-python missing, say)."""

    kind = "backend_unavailable"


class CpuUnsupported(BackendUnavailable):
    """The llama.cpp build was compiled for instructions this CPU does not run (it would die of SIGILL)."""

    kind = "cpu_unsupported"


# -- snapshots and the store ---------------------------------------------------------------------------------
class SnapshotError(EngramError):
    """A snapshot file cannot be used: corrupt, truncated, or written by something else. The store is
    intact, but this snapshot cannot be used with the loaded model: a conflict."""

    kind = "snapshot_error"
    status = 409


class SnapshotCorrupt(SnapshotError):
    kind = "snapshot_corrupt"


class SnapshotMismatch(SnapshotError):
    """The file is intact but belongs to another model, dtype or format version."""

    kind = "snapshot_mismatch"


class SnapshotInUse(UsageError):
    """A snapshot cannot be deleted (it is a session's head or branch point, pinned, or being read)."""

    kind = "snapshot_in_use"
    status = 409


class AlreadyExists(UsageError):
    kind = "already_exists"
    status = 409


class StoreLocked(EngramError):
    """Another process has this data directory's store open."""

    kind = "store_locked"
    status = 503


class StoreClosed(EngramError):
    kind = "store_closed"
    status = 503


class DiskFull(EngramError):
    """The file system holding the snapshots has no room for one more: the snapshot is not taken."""

    kind = "disk_full"


class DataDirUnusable(EngramError):
    """The data directory cannot be used: read-only, not ours, or not a directory."""

    kind = "data_dir_unusable"


# -- N-gram memory tables ------------------------------------------------------------------------------------
class NgramTableError(EngramError):
    """An N-gram memory table cannot be used: missing, incomplete, or it does not fit the tiers."""

    kind = "ngram_table_error"


class NgramTableCorrupt(NgramTableError):
    """The table file is truncated or its bytes do not match the checksum its sidecar recorded."""

    kind = "ngram_table_corrupt"


class NgramTableMismatch(NgramTableError):
    """The table file is intact but was written for another layer, shape, dtype, seed or config."""

    kind = "ngram_table_mismatch"


# -- the daemon ----------------------------------------------------------------------------------------------
class DaemonUnreachable(EngramError):
    exit_code = 3
    kind = "daemon_unreachable"


class QueueFull(EngramError):
    """More generation requests are waiting than the daemon's queue holds."""

    kind = "queue_full"
    status = 429


class SessionBusy(EngramError):
    """A session cannot be deleted or reset while a turn of it runs or waits: that turn would record into
    it afterwards (daemon/session_changes.py)."""

    kind = "session_busy"
    status = 409


class ShuttingDown(EngramError):
    kind = "shutting_down"
    status = 503


class Cancelled(EngramError):
    """The request was cancelled (client gone, daemon stopping) before it produced anything."""

    kind = "cancelled"
    status = 499  # nginx's "client closed request"; nobody is there to read it
