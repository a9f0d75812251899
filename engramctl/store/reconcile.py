"""Make the index and the snapshot files agree again after a crash (run on every open).

- temp files (a write cut short): deleted; they were never referenced.
- files with no index row (or that are not snapshot files at all): moved to quarantine, never deleted.
- rows with no file: dropped; a session whose head it was falls back to the nearest surviving
  ancestor, or to re-prefilling its transcript.
- rows not yet marked durable whose file is complete (crash between rename and index update): the
  file is verified and the row marked durable; a bad one is quarantined and the row dropped.
- durable rows: the file size must match the index (cheap); with verify=True every checksum is
  checked too. Corrupt files go to quarantine and their rows are dropped.
- finally any reference to a missing row (head, branch point, parent) is cleared.

`verify_all` (Store.verify) checks every durable file's checksum of an open store on demand.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import TYPE_CHECKING

from engramctl.errors import SnapshotCorrupt, SnapshotMismatch
from engramctl.store import snapshot_file
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
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


def reconcile(index: Index, files: SnapshotFiles, verify: bool = False) -> ReconcileReport:
    report = ReconcileReport()
    on_disk, temps, other = files.scan()
    for p in temps:
        p.unlink(missing_ok=True)
        report.temp_files_removed.append(p.name)
    for p in other:
        if files.quarantine(p, "not a snapshot file"):
            report.quarantined[p.name] = "not a snapshot file"
    rows = {r.id: r for r in index.snapshots()}
    for sid, path in on_disk.items():
        if sid not in rows and files.quarantine(path, "no index row for this file"):
            report.quarantined[path.name] = "no index row for this file"

    drop: dict[str, str] = {}
    for sid, rec in rows.items():
        if sid not in on_disk:
            drop[sid] = "file missing" if rec.durable else "never written (stopped before the write finished)"
            continue
        reason = None
        if not rec.durable or verify:
            checksum, reason = verify_file(files, sid)
            if checksum is not None and not rec.durable:
                index.update_snapshot(sid, durable=1, nbytes=files.size(sid), checksum=checksum)
                report.made_durable.append(sid)
        elif files.size(sid) != rec.nbytes:
            reason = f"size {files.size(sid)} differs from the indexed {rec.nbytes} bytes"
        if reason is not None:
            files.quarantine(on_disk[sid], reason)
            report.quarantined[on_disk[sid].name] = reason
            drop[sid] = f"corrupt: {reason}"
    with index.tx():
        index.remove_snapshots(drop)
        index.execute(
            "UPDATE sessions SET head = NULL WHERE head IS NOT NULL AND head NOT IN (SELECT id FROM snapshots)"
        )
        index.execute(
            "UPDATE sessions SET base = NULL WHERE base IS NOT NULL AND base NOT IN (SELECT id FROM snapshots)"
        )
        index.execute(
            "UPDATE snapshots SET parent = NULL WHERE parent IS NOT NULL AND parent NOT IN (SELECT id FROM snapshots)"
        )
    report.rows_dropped = drop
    if temps or report.quarantined:
        files.fsync_dir()
    if not report.clean:
        log.warning("store reconciled after an unclean stop: %s", json.dumps(report.to_json()))
    return report


def verify_all(core: StoreCore) -> dict[str, str]:
    """Check every durable snapshot's checksum; quarantine corrupt ones. Returns {id: reason}."""
    bad: dict[str, str] = {}
    with core.lock:
        core.check_open()
        records = core.index.snapshots()
    for rec in records:
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
