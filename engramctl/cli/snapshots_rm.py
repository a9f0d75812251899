"""`engramctl snapshots rm`: delete snapshots, or a whole session, through the daemon. Shows what goes
and the bytes freed first; asks on a terminal, refuses without --yes elsewhere."""

from __future__ import annotations

import sys
from typing import Any, Optional

import typer

from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.complete import complete_session, complete_snapshot
from engramctl.cli.output import size
from engramctl.cli.snapshot_table import snapshot_columns
from engramctl.cli.snapshots_common import daemon_client, listing_over
from engramctl.errors import NotFound, UsageError
from engramctl.store.names import MIN_ID_PREFIX


def stdin_is_tty() -> bool:
    try:
        return sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def _refuse_or_confirm(out: Any, what: str, yes: bool) -> bool:
    """True to go ahead. Without --yes: ask on a terminal, refuse when stdin is not one."""
    if yes:
        return True
    if not stdin_is_tty():
        raise UsageError(
            f"refusing to delete {what} without confirmation: stdin is not a terminal.",
            hint="add --yes to delete, or --dry-run to only preview",
        )
    return out.confirm(f"Delete {what}?")


def rm(
    refs: Optional[list[str]] = typer.Argument(
        None,
        metavar="ID",
        autocompletion=complete_snapshot,
        help=f"Snapshot ids or unique prefixes ({MIN_ID_PREFIX}+ characters).",
    ),
    session: Optional[str] = typer.Option(
        None,
        "--session",
        "-s",
        metavar="NAME",
        autocompletion=complete_session,
        help="Delete this whole session: its snapshots and its transcript.",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", "-n", help="Only show what would be deleted."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    force: bool = typer.Option(
        False,
        "--force",
        "-f",
        help="Also delete pinned snapshots and session heads (those sessions fall back to the parent snapshot).",
    ),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Delete snapshots, or a whole session. Shows what goes and the bytes freed first."""
    out = common.output(json_, quiet)
    if bool(refs) == bool(session):
        raise UsageError(
            "give snapshot ids or --session NAME (one of the two).",
            hint="engramctl snapshots rm ID... | engramctl snapshots rm --session NAME",
        )
    client = daemon_client(common.settings(), out)
    with listing_over(client) as listing:
        if session:
            _rm_session(out, client, listing, session, dry_run, yes)
        else:
            _rm_ids(out, client, listing, refs or [], dry_run, yes, force)


def _rm_ids(out: Any, client: Any, listing: Any, refs: list[str], dry_run: bool, yes: bool, force: bool) -> None:
    snaps = list({s["id"]: s for s in (listing.snapshot(r) for r in refs)}.values())
    ids = [s["id"] for s in snaps]
    blocked = [s for s in snaps if (s.get("pinned") or s.get("head_of") or s.get("branch_point_of"))]
    freed = listing.freed_bytes(ids)
    preview = {"dry_run": True, "deleted": ids, "freed_bytes": freed, "in_use": [s["id"] for s in blocked]}
    if out.human:
        out.note(f"Will delete {len(snaps)} snapshot(s), freeing {size(freed)}:")
        out.line(_rm_table(snaps))
    if blocked and not force:
        why = "; ".join(f"{s['id'][:12]}: {_in_use(s)}" for s in blocked)
        raise UsageError(
            f"{len(blocked)} of these snapshots are in use ({why}).",
            hint="add --force to delete them anyway (those sessions fall back to the parent snapshot)",
        )
    if dry_run:
        out.result("Dry run: nothing deleted.", json_obj=preview, quiet_lines=ids)
        return
    if not _refuse_or_confirm(out, f"{len(snaps)} snapshot(s) ({size(freed)})", yes):
        out.note("Nothing deleted.")
        raise typer.Exit(1)
    for sid in ids:
        client.delete_snapshot(sid, force=force)
    res = {"deleted": ids, "freed_bytes": freed}
    out.result(
        f"Deleted {len(res['deleted'])} snapshot(s), freed {size(res['freed_bytes'])}.",
        json_obj={"dry_run": False, **res},
        quiet_lines=res["deleted"],
    )


def _in_use(s: dict) -> str:
    why = []
    if s.get("pinned"):
        why.append("pinned")
    if s.get("head_of"):
        why.append("head of " + ", ".join(s["head_of"]))
    if s.get("branch_point_of"):
        why.append("branch point of " + ", ".join(s["branch_point_of"]))
    return ", ".join(why)


def _rm_table(snaps: list[dict]) -> str:
    from engramctl.cli.output import render_table

    return render_table(snaps, snapshot_columns(snaps))


def _rm_session(out: Any, client: Any, listing: Any, name: str, dry_run: bool, yes: bool) -> None:
    sessions = {s["name"]: s for s in listing.sessions()}
    if name not in sessions:
        raise NotFound(f"no session named {name!r}.", hint="engramctl ps lists sessions")
    others = {v for s in sessions.values() if s["name"] != name for v in (s.get("head"), s.get("base")) if v}
    snaps = listing.snapshots(name)
    going = [s for s in snaps if s["id"] not in others]
    kept = [s for s in snaps if s["id"] in others]
    freed = listing.freed_bytes([s["id"] for s in going])
    n_msg = sessions[name].get("n_messages", 0)
    preview = {
        "dry_run": True,
        "session": name,
        "deleted": [s["id"] for s in going],
        "freed_bytes": freed,
        "kept_for_branches": [s["id"] for s in kept],
        "messages": n_msg,
    }
    if out.human:
        out.note(
            f"Will delete session {name!r}: {len(going)} snapshot(s) ({size(freed)}) and its transcript "
            f"({n_msg} message(s))."
        )
        if going:
            out.line(_rm_table(going))
        if kept:
            out.note(f"{len(kept)} snapshot(s) stay: other sessions branched from them.")
    if dry_run:
        out.result("Dry run: nothing deleted.", json_obj=preview, quiet_lines=preview["deleted"])
        return
    if not _refuse_or_confirm(out, f"session {name!r} ({len(going)} snapshot(s), {size(freed)})", yes):
        out.note("Nothing deleted.")
        raise typer.Exit(1)
    deleted = list(client.delete_session(name).get("deleted_snapshots") or [])
    gone = set(deleted)
    if gone != {s["id"] for s in going}:  # changed since the preview: what each freed alone, at least
        freed = sum(s.get("own_size_bytes", 0) for s in snaps if s["id"] in gone)
    res = {"session": name, "deleted": deleted, "freed_bytes": freed}
    out.result(
        f"Deleted session {name!r}: {len(res['deleted'])} snapshot(s), freed {size(res['freed_bytes'])}.",
        json_obj={"dry_run": False, **res},
        quiet_lines=res["deleted"],
    )
