"""Errors only the store raises. They subclass the shared types in engramctl.errors, so callers that
map those (UsageError -> 4xx, EngramError -> 5xx) keep working; `kind` is the specific reason."""

from __future__ import annotations

from engramctl.errors import EngramError, UsageError


class SnapshotInUse(UsageError):
    """A snapshot cannot be deleted (it is a session's head or branch point, pinned, or being read)."""

    kind = "snapshot_in_use"


class AlreadyExists(UsageError):
    kind = "already_exists"


class StoreLocked(EngramError):
    """Another process has this data directory's store open."""

    kind = "store_locked"


class StoreClosed(EngramError):
    kind = "store_closed"


class DiskFull(EngramError):
    """The file system holding the snapshots has no room for one more: the snapshot is not taken."""

    kind = "disk_full"


class DataDirUnusable(EngramError):
    """The data directory cannot be used: read-only, not ours, or not a directory."""

    kind = "data_dir_unusable"
