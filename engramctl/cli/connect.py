"""The CLI's one way to the daemon: a Client (engramctl.client) to this data directory's daemon.

Every command that changes something (chat, snapshots rm/branch/pin/unpin/import/gc, ...) calls
`connect`, which starts the daemon first when none runs (unless ENGRAM_NO_AUTOSTART), waits for one that
is still loading its model, and checks that it serves the model asked for. The daemon owns the store:
the CLI never writes it. Only reads may go without a daemon (listing.py).
"""

from __future__ import annotations

from typing import Any

from engramctl.errors import ModelNotFound
from engramctl.protocol import same_model


def running(settings: Any) -> dict | None:
    """The running (or still starting) daemon's status, or None when none runs. Never starts one."""
    from engramctl.daemon.background import daemon_status

    return daemon_status(settings)


def connect(settings: Any, out: Any, *, model: str | None = None, start: bool = True) -> tuple[Any, dict]:
    """(Client, the daemon's status). Starts the daemon when none runs and `start` and autostart are
    allowed; waits for one that is loading. `model`: the daemon must serve it (ModelNotFound says how to
    switch). Without a daemon and without autostart, raises DaemonUnreachable with the hint."""
    from engramctl.client import Client
    from engramctl.daemon.background import start_background

    info = running(settings)
    if info is None and start and not settings.no_autostart:
        what = model or settings.model or "the default model"
        with out.spinner(f"starting the daemon (loading {what})"):
            info = start_background(settings, wait=True)
        for notice in (info or {}).get("notices") or ():  # e.g. the SmolLM2 fallback, worded by the daemon
            out.note(notice)
    elif info is not None and not info.get("ready"):
        with out.spinner("waiting for the daemon to load its model"):
            info = start_background(settings, wait=True)  # waits for the running one; starts nothing
    client = Client(settings, autostart=None if start else False)
    if info is None:
        client.health()  # nothing listens: DaemonUnreachable, with the hint
        info = {}
    served = info.get("model")
    if model and not same_model(model, served):
        client.close()
        raise ModelNotFound(
            f"the running daemon serves {served}, not {model}.",
            hint=f"switch with: engramctl daemon stop && engramctl chat --model {model} "
            "(or chat with the loaded model: leave out --model)",
        )
    return client, info
