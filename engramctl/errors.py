"""Typed errors. Each carries a sentence for the user and, where there is one, the next command to try."""

from __future__ import annotations


class EngramError(Exception):
    """Base of every error engramctl raises on purpose."""

    exit_code = 1
    kind = "engram_error"

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(EngramError):
    exit_code = 2
    kind = "invalid_request_error"


class InvalidName(UsageError):
    kind = "invalid_name"


class ModelNotFound(EngramError):
    kind = "model_not_found"


class UnsupportedModel(EngramError):
    kind = "unsupported_model"


class BackendUnavailable(EngramError):
    """The chosen inference backend is not installed or cannot load (llama-cpp-python missing, say)."""

    kind = "backend_unavailable"


class StateFormatError(UnsupportedModel):
    """A backend's native state does not have the layout engramctl parses (a newer llama.cpp, say)."""

    kind = "state_format_error"


class SnapshotError(EngramError):
    """A snapshot file cannot be used: corrupt, truncated, or written by something else."""

    kind = "snapshot_error"


class SnapshotCorrupt(SnapshotError):
    kind = "snapshot_corrupt"


class SnapshotMismatch(SnapshotError):
    """The file is intact but belongs to another model, dtype or format version."""

    kind = "snapshot_mismatch"


class NotFound(EngramError):
    kind = "not_found"


class ContextOverflow(UsageError):
    kind = "context_length_exceeded"


class Cancelled(EngramError):
    """The request was cancelled (client gone, daemon stopping) before it produced anything."""

    kind = "cancelled"


class DaemonUnreachable(EngramError):
    exit_code = 3
    kind = "daemon_unreachable"


class NgramTableError(EngramError):
    """An N-gram memory table cannot be used: missing, incomplete, or it does not fit the tiers."""

    kind = "ngram_table_error"


class NgramTableCorrupt(NgramTableError):
    """The table file is truncated or its bytes do not match the checksum its sidecar recorded."""

    kind = "ngram_table_corrupt"


class NgramTableMismatch(NgramTableError):
    """The table file is intact but was written for another layer, shape, dtype, seed or config."""

    kind = "ngram_table_mismatch"
