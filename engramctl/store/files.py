"""The on-disk layout of the store and the file operations on it.

    <data_dir>/index.db              SQLite index (+ -wal, -shm)
    <data_dir>/store.lock            held (flock) by the process that has the store open
    <data_dir>/snapshots/<id>.safetensors   a snapshot's (or prefix state's) own file: all of it, or its
                                     constant part when its KV is in blocks (store/blocks.py)
    <data_dir>/blocks/<block id>.safetensors   a KV block, shared by the snapshots the index says use it
    <data_dir>/quarantine/           corrupt or unknown files, moved aside, never deleted by us;
                                     quarantine/quarantine.jsonl says what each one was and why,
                                     quarantine/reconcile.jsonl what each repair after a crash did

Paths are only ever built from validated snapshot and block ids (names.snapshot_filename: both are 32 hex
digits). Dirs are 0700, files 0600.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from engramctl.pidlock import try_lock
from engramctl.store import blocks, reader, snapshot_file
from engramctl.errors import DataDirUnusable, InvalidName, StoreLocked
from engramctl.store.names import id_from_filename, snapshot_filename
from engramctl.store.reader import Placer
from engramctl.store.records import TOKEN_IDS, Payload

log = logging.getLogger("engramctl.store")
RECORDS = ("quarantine.jsonl", "reconcile.jsonl")  # the store's own lines in quarantine/, never a quarantined file


class SnapshotFiles:
    def __init__(self, data_dir: Path):
        self.root = Path(data_dir)
        self.snapshots = self.root / "snapshots"
        self.quarantine_dir = self.root / "quarantine"
        self.blocks = self.root / "blocks"
        for d in (self.root, self.snapshots, self.blocks, self.quarantine_dir):
            _usable_dir(d)
        self.index_path = self.root / "index.db"
        self._lock_fd: int | None = None

    # -- process lock --------------------------------------------------------------------------------
    def lock(self) -> None:
        fd = try_lock(self.root / "store.lock")
        if fd is None:
            raise StoreLocked(
                f"the snapshot store in {self.root} is already open in another process.",
                hint="stop the other engramctl daemon, or use another ENGRAM_HOME",
            )
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    # -- snapshot files ------------------------------------------------------------------------------
    def path(self, snapshot_id: str) -> Path:
        return self.snapshots / snapshot_filename(snapshot_id)

    def write(self, snapshot_id: str, parts: Sequence[bytes | memoryview]) -> None:
        """The file's bytes, in parts (snapshot_file.encode_parts), written atomically."""
        snapshot_file.write_atomic(self.path(snapshot_id), parts)

    def read(self, snapshot_id: str, into: Placer | None = None, check_values: bool = False) -> Payload:
        """Read and verify (checksum, format) the whole payload, its KV blocks read into place (reader.py: where
        `into` lays the tensors out); raises SnapshotCorrupt (blocks.BlockCorrupt when it is one of its blocks) /
        SnapshotMismatch; check_values: NaN/Inf too (reader.read_payload)."""
        return read_payload(self.snapshots, self.blocks, snapshot_id, into=into, check_values=check_values)

    def read_own(self, snapshot_id: str) -> Payload:
        """Only the snapshot's own file, verified: its constant part when its KV is in blocks."""
        return snapshot_file.read(self.path(snapshot_id))

    # -- KV blocks -----------------------------------------------------------------------------------
    def block_path(self, block_id: str) -> Path:
        return self.blocks / snapshot_filename(block_id)

    def write_block(self, block_id: str, parts: Sequence[bytes | memoryview]) -> None:
        """A block file, atomically, but its directory not fsynced: sync_blocks() once the snapshot's are written,
        before its own file refers to them."""
        snapshot_file.write_atomic(self.block_path(block_id), parts, sync_dir=False)

    def sync_blocks(self) -> None:
        self.fsync_dir(self.blocks)

    def read_block(self, block_id: str) -> bytes:
        return _read_block(self.blocks, block_id)

    def block_size(self, block_id: str) -> int | None:
        try:
            return self.block_path(block_id).stat().st_size
        except FileNotFoundError:
            return None

    def unlink_block(self, block_id: str) -> None:
        self.block_path(block_id).unlink(missing_ok=True)

    def scan_blocks(self) -> tuple[dict[str, Path], list[Path], list[Path]]:
        """scan() of the blocks dir."""
        return _scan(self.blocks)

    def token_ids(self, snapshot_id: str) -> list[int] | None:
        """Only the token ids, without reading (or verifying) the rest of the file."""
        from safetensors import safe_open

        try:  # numpy whichever backend wrote it: ids are int64, which numpy holds, and torch stays unloaded
            with safe_open(str(self.path(snapshot_id)), framework="numpy") as f:
                if TOKEN_IDS not in f.keys():
                    return None
                t = f.get_tensor(TOKEN_IDS)
        except Exception:  # missing, truncated or garbled: no candidate; load() will quarantine it
            return None
        return t.tolist() if t.dtype.name == "int64" and t.ndim == 1 else None

    def free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still use on the snapshots' file system (None: unknown)."""
        try:
            st = os.statvfs(self.snapshots)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def size(self, snapshot_id: str) -> int | None:
        try:
            return self.path(snapshot_id).stat().st_size
        except FileNotFoundError:
            return None

    def unlink(self, snapshot_id: str) -> None:
        self.path(snapshot_id).unlink(missing_ok=True)

    def scan(self) -> tuple[dict[str, Path], list[Path], list[Path]]:
        """({id: path} of snapshot files, temp files, anything else) in the snapshots dir."""
        return _scan(self.snapshots)

    def fsync_dir(self, d: Path | None = None) -> None:
        fd = os.open(d or self.snapshots, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- quarantine ----------------------------------------------------------------------------------
    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move a file aside (never delete it) and record why. Returns where it went."""
        path = Path(path)
        dest = self.quarantine_dir / path.name
        n = 1
        while dest.exists() or dest.name in RECORDS:
            dest = self.quarantine_dir / f"{path.name}.{n}"
            n += 1
        try:
            os.replace(path, dest)
        except FileNotFoundError:
            return None
        self.record("quarantine.jsonl", {"file": dest.name, "was": path.name, "reason": reason, "time": time.time()})
        log.warning("quarantined %s -> %s: %s", path.name, dest, reason)
        return dest

    def record(self, name: str, entry: dict) -> Path:
        """Append `entry` as one JSON line to quarantine/<name> (quarantine.jsonl, reconcile.jsonl): what the store
        did to a user's files, kept beside them. Returns the file's path."""
        path = self.quarantine_dir / name
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(json.dumps(entry) + "\n")
        return path

    def quarantined(self) -> list[Path]:
        return sorted(p for p in self.quarantine_dir.iterdir() if p.name not in RECORDS)


def read_payload(
    snapshots_dir: Path, blocks_dir: Path, snapshot_id: str, into: Placer | None = None, check_values: bool = False
) -> Payload:
    """A stored snapshot's whole payload, verified, from its file and its KV blocks: what a restore and
    `snapshots export` read (the latter without opening the store: the file lists its blocks)."""
    path = Path(snapshots_dir) / snapshot_filename(snapshot_id)
    return reader.read_payload(
        path, lambda bid: Path(blocks_dir) / snapshot_filename(bid), into=into, check_values=check_values
    )


def _read_block(blocks_dir: Path, block_id: str) -> bytes:
    try:
        return (blocks_dir / snapshot_filename(block_id)).read_bytes()
    except FileNotFoundError:
        raise blocks.BlockCorrupt(block_id, f"KV block {block_id} is missing.") from None
    except InvalidName:  # not a block id: a damaged list
        raise blocks.BlockCorrupt(block_id, f"{block_id[:40]!r} is not a KV block id.") from None


def _scan(d: Path) -> tuple[dict[str, Path], list[Path], list[Path]]:
    ids: dict[str, Path] = {}
    temps: list[Path] = []
    other: list[Path] = []
    for p in d.iterdir():
        sid = id_from_filename(p.name)
        if sid is not None and p.is_file():
            ids[sid] = p
        elif p.name.startswith(".") and p.name.endswith(".tmp"):
            temps.append(p)
        else:
            other.append(p)
    return ids, temps, other


def _usable_dir(d: Path) -> None:
    """Create `d` (0700) or check it: ours and writable. Anything else is a DataDirUnusable that says
    which directory and why, at start, instead of a traceback on the first write."""
    hint = "point ENGRAM_HOME at a writable directory you own, or fix this one's owner and mode"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = d.stat()
    except OSError as e:
        raise DataDirUnusable(f"cannot use the data directory {d}: {e.strerror or e}.", hint=hint) from None
    if st.st_uid != os.geteuid():
        # another user could read or replace the snapshots (conversations); refuse even as root
        raise DataDirUnusable(
            f"the data directory {d} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}).", hint=hint
        )
    try:
        os.chmod(d, 0o700)
    except OSError as e:
        raise DataDirUnusable(f"cannot use the data directory {d}: {e.strerror or e}.", hint=hint) from None
    if not os.access(d, os.W_OK | os.X_OK) or os.statvfs(d).f_flag & os.ST_RDONLY:
        raise DataDirUnusable(f"the data directory {d} is read-only.", hint=hint)
