"""`engramctl snapshots ls | info | export | path`: the reads. They ask the daemon when it runs, else
read the store (listing.py); nothing here changes anything. ls is snapshots_ls.py's (shortcut.py runs it without
typer); this declares its options."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from engramctl.cli import common, snapshots_ls
from engramctl.cli.common import JsonOpt, QuietOpt
from engramctl.cli.output import ago, count, size, timestamp, yes_no
from engramctl.cli.snapshots_common import IdArg, SessionOpt, read_listing
from engramctl.errors import UsageError


def ls(
    session: Optional[str] = SessionOpt,
    json_: bool = JsonOpt,
    quiet: bool = QuietOpt,
) -> None:
    """List snapshots, oldest first (all sessions, or one with --session)."""
    snapshots_ls.ls(session, json_, quiet)


def info(ref: str = IdArg, json_: bool = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Show everything about one snapshot."""
    out = common.output(json_, quiet)
    with read_listing(common.settings(), out) as listing:
        snap = listing.snapshot(ref)
    snap.update(_written_by(snap.get("path")))
    fields = [
        ("id", snap["id"]),
        ("session", snap["session"]),
        ("parent", snap.get("parent")),
        ("tokens", count(snap["n_tokens"])),
        ("messages", snap.get("n_messages")),
        ("size", f"{size(snap['nbytes'])} ({snap['nbytes']:,} bytes)"),
        ("own", f"{size(snap.get('own_size_bytes') or 0)} (freed when it is deleted)"),
        ("shared", f"{size(snap.get('shared_size_bytes') or 0)} (KV blocks other snapshots use too)"),
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
    with read_listing(common.settings(), out) as listing:
        res = transfer.export_snapshot(listing, ref, file)
    sid = res["id"]
    out.result(f"Exported {sid[:12]} to {file} ({size(res['nbytes'])}).", json_obj=res, quiet_lines=[str(file)])


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
