"""Make the index and the snapshot files agree again after a crash (run on every open).

- temp files (a write cut short): deleted; they were never referenced.
- files with no index row (or that are not snapshot files at all): moved to quarantine, never deleted.
- rows with no file: dropped; a session whose head it was falls back to the nearest surviving
  ancestor, or to re-prefilling its transcript.
- rows not yet marked durable whose file is complete (crash between rename and index update): the
  file is verified and the row marked durable; a bad one is quarantined and the row dropped.
- durable rows: the file size must match the index (cheap); with verify=True every checksum is
  checked too. Corrupt files go to quarantine and their rows are dropped.
- KV blocks (blocks/): temp files deleted; a block row whose file is missing, damaged (checksum, size) or was
  never completed drops every snapshot that uses it (and only those); a row not yet marked durable whose file
  verifies is marked durable; a block file no row names (its last user was deleted just before a crash) is
  deleted, as is any block no snapshot uses once the rows above are dropped. A snapshot row adopted from its
  complete file must list the blocks the index says it uses, all of them durable.
- finally any reference to a missing row (head, branch point, parent) is cleared.

`verify_all` (Store.verify) checks every durable file's checksum of an open store on demand.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engramctl.errors import SnapshotCorrupt, SnapshotMismatch
from engramctl.store import blocks, snapshot_file
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
from engramctl.store.names import id_from_filename
from engramctl.store.records import ReconcileReport

if TYPE_CHECKING:
    from engramctl.store.core import StoreCore

log = logging.getLogger("engramctl.store")


def checksum_of(buf: bytes) -> str | None:
    """The checksum recorded in a snapshot file's header (the start of a file as snapshot_file.encode and
    encode_parts' first part give it: the length-prefixed header)."""
    (n,) = struct.unpack("<Q", buf[:8])
    return json.loads(buf[8 : 8 + n])["__metadata__"].get("checksum")


def verify_file(files: SnapshotFiles, snapshot_id: str) -> tuple[str | None, str | None]:
    """(checksum, None) if the file verifies, (None, reason) if it is corrupt. A file of another
    format version is not corrupt: (None, None) with a log line, and it is left alone."""
    path = files.path(snapshot_id)
    try:
        buf = path.read_bytes()
        snapshot_file.decode(buf, source=f"snapshot {path.name}")
        return checksum_of(buf), None
    except SnapshotCorrupt as e:
        return None, e.message
    except SnapshotMismatch as e:
        log.warning("%s", e.message)
        return None, None
    except OSError as e:
        return None, f"unreadable ({e})"


def verify_block(files: SnapshotFiles, block_id: str) -> tuple[str | None, str | None]:
    """verify_file() of a KV block: (checksum, None), or (None, reason) when it is damaged or not that block."""
    try:
        buf = files.read_block(block_id)
        header = snapshot_file.verify(buf, source=f"KV block {block_id}")
    except (SnapshotCorrupt, SnapshotMismatch) as e:
        return None, e.message
    except OSError as e:
        return None, f"unreadable ({e})"
    meta = header["__metadata__"]
    if meta.get("kind") != blocks.BLOCK_KIND or meta.get("block_id") != block_id:
        return None, "not the KV block its name says"
    return meta.get("checksum"), None


def _scan(d: Path) -> tuple[dict[str, tuple[str, int]], list[Path], list[Path]]:
    """({id: (path, size)} of a directory's snapshot or block files, temp files, anything else): files.py's scan
    with each file's size from the one stat its directory entry takes, so an open costs a listing of the
    directory, not two system calls and a Path a file."""
    ids: dict[str, tuple[str, int]] = {}
    temps: list[Path] = []
    other: list[Path] = []
    with os.scandir(d) as entries:
        for e in entries:
            sid = id_from_filename(e.name)
            if sid is not None and e.is_file(follow_symlinks=False):
                ids[sid] = (e.path, e.stat(follow_symlinks=False).st_size)
            elif e.name.startswith(".") and e.name.endswith(".tmp"):
                temps.append(Path(e.path))
            else:
                other.append(Path(e.path))
    return ids, temps, other


def _reconcile_blocks(index: Index, files: SnapshotFiles, verify: bool, report: ReconcileReport) -> dict[str, str]:
    """The KV block pass: returns {snapshot id: reason} for the snapshots a missing or damaged block loses."""
    scanned, temps, other = _scan(files.blocks)
    on_disk = {bid: path for bid, (path, _) in scanned.items()}  # paths as str: a Path only where one acts
    _sweep(files, temps, other, "not a KV block file", report)
    rows = index.blocks()
    for bid, path in on_disk.items():
        if bid not in rows:
            Path(path).unlink(missing_ok=True)
            report.blocks_removed.append(bid)
    lost: dict[str, str] = {}
    for bid, row in rows.items():
        reason = None
        if bid not in on_disk:
            reason = "KV block file missing" if row["durable"] else "KV block never written"
        elif not row["durable"] or verify:
            checksum, reason = verify_block(files, bid)
            if checksum is not None and not row["durable"]:
                index.update_block(bid, durable=1, nbytes=files.block_size(bid), checksum=checksum)
        elif scanned[bid][1] != row["nbytes"]:
            reason = f"KV block size {scanned[bid][1]} differs from the indexed {row['nbytes']} bytes"
        if reason is None:
            continue
        if bid in on_disk and files.quarantine(Path(on_disk[bid]), reason):
            report.quarantined[Path(on_disk[bid]).name] = reason
        for sid in index.block_users(bid):
            lost.setdefault(sid, f"KV block {bid}: {reason}")
    return lost


def _blocks_check_out(index: Index, files: SnapshotFiles, sid: str) -> bool:
    """A written snapshot file lists the blocks the index says it uses, and they are all durable."""
    try:
        listed = blocks.block_ids(snapshot_file.read_metadata(files.path(sid)))
    except SnapshotCorrupt:
        return False
    if listed != index.block_ids_of(sid):
        return False
    return all((row := index.block(bid)) is not None and row["durable"] for bid in listed)


def _sweep(files: SnapshotFiles, temps: list, other: list, what: str, report: ReconcileReport) -> None:
    """Half-written temp files go; a file that is not what its directory holds is quarantined as `what`."""
    for p in temps:
        p.unlink(missing_ok=True)
        report.temp_files_removed.append(p.name)
    for p in other:
        if files.quarantine(p, what):
            report.quarantined[p.name] = what


def reconcile(index: Index, files: SnapshotFiles, verify: bool = False) -> ReconcileReport:
    report = ReconcileReport()
    lost = _reconcile_blocks(index, files, verify, report)
    scanned, temps, other = _scan(files.snapshots)
    on_disk = {sid: path for sid, (path, _) in scanned.items()}
    _sweep(files, temps, other, "not a snapshot file", report)
    rows = index.snapshot_states()
    for sid, path in on_disk.items():
        if sid not in rows and files.quarantine(Path(path), "no index row for this file"):
            report.quarantined[Path(path).name] = "no index row for this file"

    drop: dict[str, str] = {}
    for sid, rec in rows.items():
        if sid in lost:
            if sid in on_disk:
                files.quarantine(Path(on_disk[sid]), lost[sid])
                report.quarantined[Path(on_disk[sid]).name] = lost[sid]
            drop[sid] = lost[sid]
            continue
        if sid not in on_disk:
            drop[sid] = "file missing" if rec.durable else "never written (stopped before the write finished)"
            continue
        reason = None
        if not rec.durable or verify:
            checksum, reason = verify_file(files, sid)
            if checksum is not None and not rec.durable:
                if not _blocks_check_out(index, files, sid):
                    files.unlink(sid)  # written, but its blocks were not: as if it never was
                    drop[sid] = "never written (its KV blocks were not)"
                    continue
                index.update_snapshot(sid, durable=1, nbytes=files.size(sid), checksum=checksum)
                report.made_durable.append(sid)
        elif scanned[sid][1] != rec.file_bytes:
            reason = f"size {scanned[sid][1]} differs from the indexed {rec.file_bytes} bytes"
        if reason is not None:
            files.quarantine(Path(on_disk[sid]), reason)
            report.quarantined[Path(on_disk[sid]).name] = reason
            drop[sid] = f"corrupt: {reason}"
    with index.tx():
        index.remove_snapshots(drop)
        unused = index.drop_unused_blocks()
        index.execute(
            "UPDATE sessions SET head = NULL WHERE head IS NOT NULL AND head NOT IN (SELECT id FROM snapshots)"
        )
        index.execute(
            "UPDATE sessions SET base = NULL WHERE base IS NOT NULL AND base NOT IN (SELECT id FROM snapshots)"
        )
        index.execute(
            "UPDATE snapshots SET parent = NULL WHERE parent IS NOT NULL AND parent NOT IN (SELECT id FROM snapshots)"
        )
    for bid, _ in unused:
        files.unlink_block(bid)
        report.blocks_removed.append(bid)
    report.rows_dropped = drop
    if temps or report.quarantined:
        files.fsync_dir()
    if report.blocks_removed:
        files.fsync_dir(files.blocks)
    if not report.clean:
        kept = files.record("reconcile.jsonl", {"time": time.time(), **report.to_json()})
        log.warning("store reconciled after an unclean stop: %s (the whole report: %s)", report.summary(), kept)
    return report


def verify_all(core: StoreCore) -> dict[str, str]:
    """Check every durable snapshot's checksum; quarantine corrupt ones. Returns {id: reason}."""
    bad: dict[str, str] = {}
    with core.lock:
        core.check_open()
        records = core.index.snapshots(kind=None)
        block_rows = [bid for bid, row in core.index.blocks().items() if row["durable"]]
    for bid in block_rows:
        _, reason = verify_block(core.files, bid)
        if reason is not None:
            with core.lock:
                if core.index.block(bid) is not None:
                    core.files.quarantine(core.files.block_path(bid), reason)
                    users = core.index.block_users(bid)
                    core.remove(users)
                    bad.update({sid: f"KV block {bid}: {reason}" for sid in users})
    for rec in records:
        if rec.id in bad:
            continue
        if not rec.durable:
            continue
        _, reason = verify_file(core.files, rec.id)
        if reason is not None:
            with core.lock:
                if core.index.snapshot(rec.id) is not None:
                    core.files.quarantine(core.files.path(rec.id), reason)
                    core.remove([rec.id])
                    bad[rec.id] = reason
    return bad
