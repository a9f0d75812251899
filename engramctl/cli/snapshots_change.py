"""`engramctl snapshots branch | pin | unpin | import | gc`: the changes, each one request to the daemon
(connect.py starts it first when none runs), printed from the answer."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.complete import complete_session_or_snapshot
from engramctl.cli.output import count, short_ids, size
from engramctl.cli.snapshots_common import IdArg, daemon_client, listing_over
from engramctl.errors import NotFound, UsageError
from engramctl.protocol import Session, Snapshot
from engramctl.store.names import is_id_prefix


def branch(
    source: str = typer.Argument(
        ...,
        metavar="SOURCE",
        help="A session name (its latest state) or a snapshot id/prefix.",
        autocompletion=complete_session_or_snapshot,
    ),
    new_session: str = typer.Argument(..., metavar="NEW_SESSION", help="Name of the new session."),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Start a new session from a session's latest state or from any snapshot. Nothing is copied."""
    out = common.output(json_, quiet)
    client = daemon_client(common.settings(), out)
    with listing_over(client) as listing:
        src = source
        if source not in listing.session_names():
            try:
                src = listing.snapshot(source)["id"]
            except UsageError:
                if is_id_prefix(source.lower()):  # an id prefix that matches several: say so
                    raise
                raise NotFound(
                    f"no session or snapshot named {source!r}.", hint="engramctl ps; engramctl snapshots ls"
                ) from None
        res = Session.from_json(client.branch_snapshot(src, new_session)).to_json()
    frm = f"session {source!r}" if src == source and len(src) != 32 else f"snapshot {src[:12]}"
    out.result(
        f"Created session {new_session!r} from {frm}. Continue it with: engramctl chat --session {new_session}",
        json_obj=res,
        quiet_lines=[new_session],
    )


def pin(
    ref: str = IdArg,
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Also set a label."),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Pin a snapshot: retention and eviction never delete it."""
    out = common.output(json_, quiet)
    with daemon_client(common.settings(), out) as client:
        res = Snapshot.from_json(client.pin_snapshot(ref, label=label)).to_dict()
    sid = res["id"]
    out.result(f"Pinned {sid[:12]}" + (f" as {label!r}." if label else "."), json_obj=res, quiet_lines=[sid])


def unpin(ref: str = IdArg, json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Unpin a snapshot: retention may delete it again."""
    out = common.output(json_, quiet)
    with daemon_client(common.settings(), out) as client:
        res = Snapshot.from_json(client.unpin_snapshot(ref)).to_dict()
    sid = res["id"]
    out.result(f"Unpinned {sid[:12]}.", json_obj=res, quiet_lines=[sid])


def import_(
    file: Path = typer.Argument(
        ...,
        metavar="FILE",
        help="A snapshot file written by `snapshots export`.",
        exists=True,
        dir_okay=False,
        readable=True,
    ),
    session: Optional[str] = typer.Option(
        None, "--session", "-s", metavar="NAME", help="Session to create (default: the one recorded in the file)."
    ),
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Label the imported snapshot."),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Import a snapshot file as a new session, through the daemon. The file is verified like a restore
    (checksum, format) and must fit the loaded model (fingerprint, dtype, layout), else nothing is stored."""
    from engramctl.cli import transfer

    out = common.output(json_, quiet)
    with daemon_client(common.settings(), out) as client:
        res = transfer.import_snapshot(client, file.expanduser(), session, label)
    out.result(
        f"Imported {file.name} as session {res['session']!r} (snapshot {res['id'][:12]}, "
        f"{count(res['n_tokens'])} tokens). Continue it with: engramctl chat --session {res['session']}",
        json_obj=res,
        quiet_lines=[res["id"]],
    )


def gc(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Apply retention now: keep-last-N per session, TTL, the disk budget. Pins are never deleted."""
    out = common.output(json_, quiet)
    with daemon_client(common.settings(), out) as client:
        answer = client.gc_snapshots()
    res = {k: answer.get(k) for k in ("deleted", "freed_bytes", "messages_removed")}
    deleted = res.get("deleted") or {}
    msg = f"Deleted {len(deleted)} snapshot(s), freed {size(res.get('freed_bytes', 0))}"
    if res.get("messages_removed"):
        msg += f", dropped {res['messages_removed']} unreachable message(s)"
    if out.human and deleted:
        short = short_ids(deleted)
        for sid, why in deleted.items():
            out.note(f"  {short[sid]}  {why}")
    out.result(msg + ".", json_obj=res, quiet_lines=list(deleted))
