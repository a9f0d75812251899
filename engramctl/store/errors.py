"""The store's errors, defined with every other in engramctl.errors; re-exported here for the store's
modules that import them from this one."""

from __future__ import annotations

from engramctl.errors import AlreadyExists, DataDirUnusable, DiskFull, SnapshotInUse, StoreClosed, StoreLocked

__all__ = ["AlreadyExists", "DataDirUnusable", "DiskFull", "SnapshotInUse", "StoreClosed", "StoreLocked"]
