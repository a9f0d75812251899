"""The CLI's one door to the daemon: engramctl.client (HTTP) and engramctl.daemon.runner (process).

Kept apart so the command modules stay importable (and `--help` instant) without httpx/fastapi.
"""

from __future__ import annotations

from typing import Any


def status(settings: Any) -> dict | None:
    """The running daemon's status, or None when none runs. Never starts one."""
    try:
        from engramctl.daemon.runner import daemon_status
    except ImportError:
        return None
    return daemon_status(settings)


def daemon_catalog(settings: Any) -> Any:
    """A catalog backed by the running daemon."""
    from engramctl.cli.remote import DaemonCatalog

    return DaemonCatalog.connect(settings)
