"""`engramctl snapshots ...`: list, inspect, delete, branch, pin, export/import, gc.

Every change (rm, branch, pin, unpin, import, gc) goes through the daemon's client (connect.py: the
daemon is started first when none runs). Reads (ls, info, export) ask the daemon when it runs, else read
the store (listing.py). Ids may be abbreviated to any unique prefix (store.names.MIN_ID_PREFIX+ hex
digits), resolved by the store's rule wherever they are read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import typer

from engramctl.cli import common
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.complete import complete_session, complete_session_or_snapshot, complete_snapshot
from engramctl.cli.output import Column, ago, count, short_ids, size, timestamp, yes_no
from engramctl.errors import NotFound, UsageError
from engramctl.protocol import Session, Snapshot
from engramctl.store.names import MIN_ID_PREFIX

app = typer.Typer(
    name="snapshots",
    help="List, inspect, delete, branch, pin, export and import snapshots.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

IdArg = typer.Argument(
    ...,
    metavar="ID",
    autocompletion=complete_snapshot,
    help=f"Snapshot id or a unique prefix ({MIN_ID_PREFIX}+ characters).",
)
SessionOpt = typer.Option(
    None, "--session", "-s", metavar="NAME", help="Only this session.", autocompletion=complete_session
)


def _read(settings: Any, out: Any):
    """The listing: the daemon's when it runs, else the store's."""
    from engramctl.cli.listing import open_listing

    return open_listing(settings, out)


def _daemon(settings: Any, out: Any) -> Any:
    """The daemon's client: every change goes through the daemon (started first when none runs)."""
    from engramctl.cli.connect import connect

    return connect(settings, out)[0]


def _listing_over(client: Any) -> Any:
    """A listing over the daemon's client: what a change shows before it is made."""
    from engramctl.cli.listing import over

    return over(client)


def _flags(snap: dict) -> str:
    parts = []
    if snap.get("head_of"):
        parts.append("head")
    if snap.get("pinned"):
        parts.append("pinned")
    if not snap.get("durable", True):
        parts.append("writing")
    if snap.get("label"):
        parts.append(repr(snap["label"]) if " " in snap["label"] else snap["label"])
    return " ".join(parts)


def _tiers(snap: dict) -> str:
    return ",".join(snap.get("tiers") or []) or "-"


def snapshot_columns(snaps: list[dict], with_session: bool = True) -> list[Column]:
    short = short_ids(s["id"] for s in snaps)
    cols = [Column("ID", lambda s: short[s["id"]])]
    if with_session:
        cols.append(Column("SESSION", "session"))
    cols += [
        Column("TOKENS", "n_tokens", ">", count),
        Column("SIZE", "nbytes", ">", size),
        Column("TIERS", _tiers),
        Column("CREATED", "created", fmt=ago),
        Column("NOTES", _flags),
    ]
    return cols


@app.command("ls")
def ls(
    session: Optional[str] = SessionOpt,
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """List snapshots, oldest first (all sessions, or one with --session)."""
    out = common.output(json_, quiet)
    with _read(common.settings(), out) as listing:
        snaps = listing.snapshots(session)
    out.table(
        snaps,
        snapshot_columns(snaps, with_session=session is None),
        quiet_key="id",
        empty="No snapshots yet. Start one with: engramctl chat --session NAME",
    )


@app.command("info")
def info(ref: str = IdArg, json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Show everything about one snapshot."""
    out = common.output(json_, quiet)
    with _read(common.settings(), out) as listing:
        snap = listing.snapshot(ref)
    snap.update(_written_by(snap.get("path")))
    fields = [
        ("id", snap["id"]),
        ("session", snap["session"]),
        ("parent", snap.get("parent")),
        ("tokens", count(snap["n_tokens"])),
        ("messages", snap.get("n_messages")),
        ("size", f"{size(snap['nbytes'])} ({snap['nbytes']:,} bytes)"),
        ("tiers", ", ".join(snap.get("tiers") or []) or "-"),
        ("durable", yes_no(snap.get("durable"))),
        ("pinned", yes_no(snap.get("pinned"))),
        ("label", snap.get("label")),
        ("head of", ", ".join(snap.get("head_of") or [])),
        ("branched by", ", ".join(snap.get("branch_point_of") or [])),
        ("model", snap.get("model_id")),
        ("fingerprint", snap.get("fingerprint")),
        ("backend", _backend_text(snap)),
        ("state format", snap.get("state_format")),
        ("dtype", snap.get("dtype")),
        ("created", f"{timestamp(snap.get('created'))} ({ago(snap.get('created'))})"),
        ("last used", f"{timestamp(snap.get('last_access'))} ({ago(snap.get('last_access'))})"),
        ("checksum", snap.get("checksum")),
        ("path", snap.get("path")),
    ]
    out.fields(fields, json_obj=snap, quiet_value=snap["id"])


def _written_by(path: str | None) -> dict[str, Any]:
    """What wrote the snapshot, from its file's header (the index does not record it). Empty while the
    file is not written yet or cannot be read; a restore re-reads and checks it anyway."""
    from engramctl.errors import SnapshotCorrupt
    from engramctl.state.codec import written_by
    from engramctl.store.snapshot_file import read_metadata

    if not path:
        return {}
    try:
        return written_by(read_metadata(Path(path)))
    except (OSError, SnapshotCorrupt):
        return {}


def _backend_text(snap: dict) -> str | None:
    if not snap.get("backend"):
        return None
    version = snap.get("backend_version")
    return f"{snap['backend']} {version}" if version else snap["backend"]


# -- rm -----------------------------------------------------------------------------------------------
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


@app.command("rm")
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
    client = _daemon(common.settings(), out)
    with _listing_over(client) as listing:
        if session:
            _rm_session(out, client, listing, session, dry_run, yes)
        else:
            _rm_ids(out, client, listing, refs or [], dry_run, yes, force)


def _rm_ids(out: Any, client: Any, listing: Any, refs: list[str], dry_run: bool, yes: bool, force: bool) -> None:
    snaps = list({s["id"]: s for s in (listing.snapshot(r) for r in refs)}.values())
    ids = [s["id"] for s in snaps]
    blocked = [s for s in snaps if (s.get("pinned") or s.get("head_of") or s.get("branch_point_of"))]
    freed = sum(s["nbytes"] for s in snaps if s.get("durable", True))
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
    freed = sum(s["nbytes"] for s in going if s.get("durable", True))
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
    sizes = {s["id"]: s["nbytes"] for s in snaps if s.get("durable", True)}
    res = {"session": name, "deleted": deleted, "freed_bytes": sum(sizes.get(i, 0) for i in deleted)}
    out.result(
        f"Deleted session {name!r}: {len(res['deleted'])} snapshot(s), freed {size(res['freed_bytes'])}.",
        json_obj={"dry_run": False, **res},
        quiet_lines=res["deleted"],
    )


# -- branch, pin --------------------------------------------------------------------------------------
@app.command("branch")
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
    client = _daemon(common.settings(), out)
    with _listing_over(client) as listing:
        src = source
        if source not in listing.session_names():
            try:
                src = listing.snapshot(source)["id"]
            except UsageError:
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


@app.command("pin")
def pin(
    ref: str = IdArg,
    label: Optional[str] = typer.Option(None, "--label", "-l", help="Also set a label."),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Pin a snapshot: retention and eviction never delete it."""
    out = common.output(json_, quiet)
    with _daemon(common.settings(), out) as client:
        res = Snapshot.from_json(client.pin_snapshot(ref, label=label)).to_dict()
    sid = res["id"]
    out.result(f"Pinned {sid[:12]}" + (f" as {label!r}." if label else "."), json_obj=res, quiet_lines=[sid])


@app.command("unpin")
def unpin(ref: str = IdArg, json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Unpin a snapshot: retention may delete it again."""
    out = common.output(json_, quiet)
    with _daemon(common.settings(), out) as client:
        res = Snapshot.from_json(client.unpin_snapshot(ref)).to_dict()
    sid = res["id"]
    out.result(f"Unpinned {sid[:12]}.", json_obj=res, quiet_lines=[sid])


# -- export / import ----------------------------------------------------------------------------------
@app.command("export")
def export(
    ref: str = IdArg,
    file: Path = typer.Argument(
        ..., metavar="FILE", help="Where to write the snapshot (.safetensors).", dir_okay=False
    ),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite FILE if it exists."),
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """Write a snapshot, with its transcript, to a standalone verified file."""
    from engramctl.cli import transfer

    out = common.output(json_, quiet)
    file = file.expanduser()
    if file.exists() and not force:
        raise UsageError(f"{file} already exists.", hint="add --force to overwrite it")
    with _read(common.settings(), out) as listing:
        res = transfer.export_snapshot(listing, ref, file)
    sid = res["id"]
    out.result(f"Exported {sid[:12]} to {file} ({size(res['nbytes'])}).", json_obj=res, quiet_lines=[str(file)])


@app.command("import")
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
    with _daemon(common.settings(), out) as client:
        res = transfer.import_snapshot(client, file.expanduser(), session, label)
    out.result(
        f"Imported {file.name} as session {res['session']!r} (snapshot {res['id'][:12]}, "
        f"{count(res['n_tokens'])} tokens). Continue it with: engramctl chat --session {res['session']}",
        json_obj=res,
        quiet_lines=[res["id"]],
    )


# -- gc, path -----------------------------------------------------------------------------------------
@app.command("gc")
def gc(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Apply retention now: keep-last-N per session, TTL, the disk budget. Pins are never deleted."""
    out = common.output(json_, quiet)
    with _daemon(common.settings(), out) as client:
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


@app.command("path")
def path(json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Print the data directory (snapshots and index)."""
    out = common.output(json_, quiet)
    st = common.settings()
    p = st.paths
    if out.json:
        out.emit_json(
            {
                "data_dir": str(p.data_dir),
                "snapshots_dir": str(p.data_dir / "snapshots"),
                "index": str(p.data_dir / "index.db"),
                "config_dir": str(p.config_dir),
                "log_dir": str(p.log_dir),
                "cache_dir": str(p.cache_dir),
            }
        )
    else:
        out.line(str(p.data_dir))
