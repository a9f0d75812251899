"""Snapshots (a Store part: `store.snapshots`): commit, the write that makes one durable, load, delete.

A commit, start to end, is in this file: `commit` checks the payload and that the disk has room
(Retention.check_disk_room), indexes the snapshot as the session's head (durable = 0) with the transcript
messages it follows, puts the payload in the hottest memory tier with room, and queues one writer-thread
job, `_write`: split off the KV blocks (blocks.py) and encode the rest (snapshot_file.py), reference the
blocks in the index (rows for new ones, durable = 0), make room within the disk budget
(Retention.make_disk_room), write the blocks not on disk yet and then the snapshot's own file atomically
(files.py: tmp -> fsync -> rename -> fsync dir), mark the new blocks and the row durable with their checksums
in one transaction, then apply keep-last-N to that session (a prefix state: the prefix budget). A snapshot
that cannot be made durable is dropped as a crash would drop it (`_abandon`): heads fall back to its
parent, the transcript is untouched, blocks only it used go.
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Sequence

from engramctl.errors import NotFound, SnapshotCorrupt
from engramctl.store import arrays, blocks, repair, snapshot_file
from engramctl.store.blocks import BlockCorrupt
from engramctl.store.core import StoreCore
from engramctl.store.crashpoints import crash_point
from engramctl.store.inflight import one_load_per_id
from engramctl.errors import SnapshotInUse
from engramctl.store.names import (
    is_snapshot_id,
    new_snapshot_id,
    one_id,
    parse_id_ref,
    validate_label,
    validate_session_name,
    validate_snapshot_id,
)
from engramctl.store.prefix import token_hash
from engramctl.store.reader import Placer
from engramctl.store.reconcile import checksum_of
from engramctl.store.records import TOKEN_IDS, Payload, SnapshotRecord, check_payload, payload_nbytes
from engramctl.store.retention import Retention
from engramctl.store.sessions import Sessions

log = logging.getLogger("engramctl.store")
BLOCK_HEADER_BYTES = 4096  # a KV block file's header, at most, over its tensors' bytes (for the disk budget)


class Snapshots:
    def __init__(self, core: StoreCore, sessions: Sessions, retention: Retention):
        self._core, self._sessions, self._retention = core, sessions, retention

    # -- commit --------------------------------------------------------------------------------------
    def commit(
        self,
        session: str,
        payload: Payload,
        parent: str | None = None,
        label: str | None = None,
        pinned: bool = False,
        messages: Sequence[dict] | None = None,
    ) -> SnapshotRecord:
        """Store a snapshot for `session` (created if new) and make it the session's head. `messages`
        are appended to the transcript first, in the same transaction; the snapshot corresponds to
        the transcript as it then stands. `parent` defaults to the session's current head."""
        c = self._core
        validate_session_name(session)
        label = None if label is None else validate_label(label)
        parent = None if parent is None else validate_snapshot_id(parent)
        ids, n_tokens = check_payload(payload)
        tensors, meta = payload
        nbytes = payload_nbytes(payload)
        with c.lock:
            c.check_open()
            base = parent if parent is not None else c.index.session_head(session)
            adds = self.new_bytes(payload, ids, base)
            self._retention.check_disk_room(adds)
            now = c.clock()
            with c.index.tx():
                sess = c.ensure_session(session, now)
                tip = c.index.session_tip(session)
                if messages:
                    tip = c.messages.append(tip, messages)
                if parent is not None:
                    c.row(parent)
                parent = parent if parent is not None else sess.head
                sid = new_snapshot_id(now)
                meta = self._insert_row(
                    sid,
                    meta,
                    now,
                    nbytes,
                    ids,
                    n_tokens=n_tokens,
                    session=session,
                    parent=parent,
                    tip=tip,
                    n_messages=c.messages.depth(tip),
                    pinned=int(pinned),
                    label=label,
                )
                c.index.update_session(
                    session,
                    head=sid,
                    tip=tip,
                    fingerprint=meta.get("fingerprint"),
                    model_id=meta.get("model_id"),
                    last_used=now,
                )
            self._hold(sid, (tensors, meta), nbytes, adds)
            record = c.with_tiers(c.index.snapshot(sid))  # type: ignore[arg-type]
        self.queue_write(sid)
        return record

    def index_prefix(self, payload: Payload, ids: list[int]) -> str:
        """Prefixes.put's commit, under the lock: a row of kind 'prefix' (no session, parent or transcript),
        the payload held in memory until written. The caller then calls queue_write outside the lock."""
        c = self._core
        tensors, meta = payload
        nbytes = payload_nbytes(payload)
        with c.lock:
            c.check_open()
            self._retention.check_disk_room(nbytes)
            now = c.clock()
            sid = new_snapshot_id(now)
            meta = self._insert_row(
                sid,
                meta,
                now,
                nbytes,
                ids,
                n_tokens=len(ids),
                session="",
                parent=None,
                tip=None,
                n_messages=0,
                pinned=0,
                label=None,
                kind="prefix",
            )
            self._hold(sid, (tensors, meta), nbytes, nbytes)  # it continues no snapshot: all of it may be new
        return sid

    def _insert_row(
        self,
        sid: str,
        meta: dict[str, str],
        now: float,
        nbytes: int,
        ids: list[int] | None,
        *,
        n_tokens: int,
        session: str,
        parent: str | None,
        **row,
    ) -> dict[str, str]:
        """The index row of a committed payload (not durable yet; commit's and index_prefix's), and its metadata
        stamped with what its file records of it. Under the lock."""
        meta = {
            **meta,
            "n_tokens": str(n_tokens),
            "snapshot_id": sid,
            "session": session,
            "parent": parent or "",
            "created": repr(now),
        }
        self._core.index.insert_snapshot(
            id=sid,
            session=session,
            parent=parent,
            n_tokens=n_tokens,
            nbytes=nbytes,
            token_hash=None if ids is None else token_hash(ids),
            fingerprint=meta.get("fingerprint"),
            model_id=meta.get("model_id"),
            created=now,
            last_access=now,
            durable=0,
            **row,
        )
        return meta

    def new_bytes(self, payload: Payload, ids: list[int] | None, base: str | None) -> int:
        """About what committing `payload` adds on disk: its bytes less the K/V of the tokens whose KV blocks the
        snapshot it continues (`base`, its parent) already has stored or queued, when its token ids begin with
        base's. Reads base's row and its block count, hashes the ids once. Under the lock."""
        nbytes = payload_nbytes(payload)
        if base is None or not ids:
            return nbytes
        row = self._core.index.one(
            "SELECT n_tokens, token_hash, (SELECT COUNT(*) FROM snapshot_blocks WHERE snapshot = ?) AS n_blocks "
            "FROM snapshots WHERE id = ?",
            (base, base),
        )
        if row is None or not row["n_blocks"] or row["n_tokens"] > len(ids):
            return nbytes
        if token_hash(ids[: row["n_tokens"]]) != row["token_hash"]:
            return nbytes
        tensors, meta = payload
        axes = blocks.token_axes(tensors, meta, len(ids))
        kv = sum(arrays.nbytes(tensors[name]) for name in axes)
        covered = min(int(row["n_blocks"]) * blocks.BLOCK_TOKENS, len(ids))
        return nbytes - kv * covered // len(ids)

    def _hold(self, sid: str, payload: Payload, nbytes: int, adds: int) -> None:
        """Put a committed payload in the hottest memory tier with room and hold it for the writer, `adds` bytes
        promised to the disk (check_disk_room counts them). Under the lock."""
        c = self._core
        c.placement.hold(sid)
        c.placement.put(sid, payload, nbytes)
        hot = c.placement.get(sid, touch=False)  # the writer uses the tier's copy: no second one
        c.pending[sid] = hot[0] if hot else payload
        c.promised[sid] = adds

    def queue_write(self, sid: str) -> None:
        """Queue the writer-thread job that makes a committed row durable. Outside the lock: it waits while the
        writer's queue is full."""
        crash_point("commit.indexed")
        self._core.writer.submit(partial(self._write, sid))

    def _write(self, sid: str) -> None:
        """Writer-thread job: split and encode, reference the KV blocks, make room within the disk budget, write
        the new blocks and the own file atomically, mark them durable. Whatever it raises before the snapshot is
        durable drops it (_abandon), never leaves it pending."""
        try:
            self._write_once(sid)
        except Exception as e:
            with self._core.lock:
                if sid not in self._core.pending:
                    raise  # durable already: the writer logs what failed after
            self._abandon(sid, f"the write failed ({type(e).__name__}: {e})")

    def _write_once(self, sid: str) -> None:
        c = self._core
        with c.lock:
            payload = c.pending.get(sid)
        if payload is None:
            return  # deleted before it was written
        tensors, meta = payload
        try:
            ids = tensors[TOKEN_IDS].tolist() if TOKEN_IDS in tensors else None
            constant, own_meta, kv = blocks.split(tensors, meta, ids)
            parts = snapshot_file.encode_parts(constant, own_meta)  # the header, then views of the tensors
        except Exception as e:
            return self._abandon(sid, f"could not encode it ({e})")
        crash_point("write.encoded")
        with c.lock:
            if sid not in c.pending:
                return
            if kv:  # referenced before they are written: no retention frees a block this snapshot needs
                c.index.use_blocks(sid, [b.id for b in kv], meta.get("fingerprint"), blocks.BLOCK_TOKENS)
            new = [b for b in kv if not c.index.block(b.id)["durable"]]
        if kv:
            crash_point("write.blocks_indexed")
        fingerprint = meta.get("fingerprint", "")
        own = sum(memoryview(part).nbytes for part in parts)
        # a block's bytes are cut when it is written, one at a time: no second copy of the KV in memory
        need = own + sum(b.data_nbytes + BLOCK_HEADER_BYTES for b in new)
        with c.lock:
            if sid not in c.pending:
                return
            if not self._retention.make_disk_room(need):
                used = c.index.durable_bytes()[0]
                return self._abandon(
                    sid,
                    f"the disk tier is full ({used} of {c.disk_budget()} bytes "
                    f"used by pinned or in-use snapshots; this one needs {need})",
                )
            c.disk_reserved += need
        written: dict[str, tuple[int, str | None]] = {}  # block id -> (file bytes, checksum)
        try:
            for b in new:
                bp = b.parts(fingerprint)
                c.files.write_block(b.id, bp)
                written[b.id] = (sum(memoryview(part).nbytes for part in bp), checksum_of(bp[0]))
            if new:
                c.files.sync_blocks()  # one directory fsync for them all, before the own file names them
                crash_point("write.blocks_written")
            c.files.write(sid, parts)
        except BaseException as e:  # any failure gives its reservation back (issue 46: not only OSError)
            with c.lock:
                c.disk_reserved -= need
            if not isinstance(e, Exception):
                raise
            return self._abandon(sid, f"writing the file failed ({type(e).__name__}: {e})")
        crash_point("write.renamed")
        with c.lock:
            c.disk_reserved -= need
            if sid not in c.pending or c.index.snapshot(sid) is None:
                c.files.unlink(sid)  # deleted while being written
                for bid in written:
                    if c.index.block(bid) is None:  # its last user went with it
                        c.files.unlink_block(bid)
                return
            with c.index.tx():
                for bid, (size, checksum) in written.items():
                    c.index.update_block(bid, durable=1, nbytes=size, checksum=checksum)
                c.index.update_snapshot(sid, durable=1, nbytes=own, checksum=checksum_of(parts[0]))
            del c.pending[sid]
            c.promised.pop(sid, None)
            c.placement.release(sid)
            crash_point("write.indexed")
            rec = c.index.snapshot(sid)
            if rec is not None and rec.kind == "prefix":
                self._retention.keep_prefixes()
            elif rec is not None:
                self._retention.keep_last(rec.session)

    def _abandon(self, sid: str, reason: str) -> None:
        """A committed snapshot that will never be durable: drop it as a crash would."""
        c = self._core
        with c.lock:
            msg = f"snapshot {sid} could not be saved: {reason}"
            log.error("%s", msg)
            c.write_errors.append(msg)
            if sid in c.pending and not c.closed:
                c.remove([sid])

    def wait_durable(self, snapshot_id: str, timeout: float | None = None) -> SnapshotRecord:
        """Block until this snapshot's file is complete; returns its record (durable=False only if
        `timeout` ran out). Raises NotFound if it was dropped because it could not be written."""
        c = self._core
        sid = self.info(snapshot_id).id
        c.writer.wait_until(lambda: sid not in c.pending, timeout)
        with c.lock:
            rec = c.index.snapshot(sid)
            if rec is None:
                why = next((e for e in reversed(c.write_errors) if sid in e), "it was deleted")
                raise NotFound(f"snapshot {sid} was not saved: {why}")
            return c.with_tiers(rec)

    # -- read ----------------------------------------------------------------------------------------
    def load(self, snapshot_id: str, *, copy: bool = False) -> Payload:
        """The snapshot's payload from the hottest tier holding it, else from disk (checksum
        verified), promoting it. A corrupt file is quarantined and SnapshotCorrupt raised (the
        session's head falls back; its transcript is intact)."""
        return self.load_from(snapshot_id, copy=copy)[0]

    @one_load_per_id  # inflight.py: a load of an id being loaded waits for that one, never reads again
    def load_from(self, snapshot_id: str, *, copy: bool = False, into: Placer | None = None) -> tuple[Payload, str]:
        """load(), and where the payload came from: a memory tier's name ("vram", "ram"), "pending"
        (saved, not yet written) or "disk" (read from its file now). A payload from memory is the one
        this process saved or already read back, so it needs no second look at its values. `into` lays out
        the tensors of a payload read from disk (store/reader.py: the backend's blob, read into in place);
        such a payload's floats are checked for NaN/Inf as they are read (a file holding one is
        corrupt): every payload this returns then holds finite values, as the memory tiers' already do."""
        c = self._core
        with c.lock:
            sid = c.row(snapshot_id).id
            c.touched[sid] = c.clock()
            if c.placement.where(sid) is not None:
                c.placement.promote(sid)
                payload, tier = c.placement.get(sid, touch=False)  # type: ignore[misc]
                return _maybe_copy(payload, copy), tier
            if sid in c.pending:
                return _maybe_copy(c.pending[sid], copy), "pending"
            c.reading[sid] += 1
            c.placement.hold(sid)
        try:
            payload = c.files.read(sid, into=into, check_values=True)
        except SnapshotCorrupt as e:
            with c.lock:
                c.done_reading(sid)
                if c.index.snapshot(sid) is None:
                    raise NotFound(f"snapshot {sid} was deleted while it was being loaded.") from None
                if isinstance(e, BlockCorrupt) and repair.from_hot_copy(c, e.block_id, e.message):
                    # whole again (a hot user held its bytes): read again within this load, as the wrapped
                    # load_from would wait for this very load (inflight.py)
                    return type(self).load_from.__wrapped__(self, snapshot_id, copy=copy, into=into)
                if isinstance(e, BlockCorrupt):  # no copy: every snapshot using the block is lost, and only those
                    if is_snapshot_id(e.block_id) and c.files.block_size(e.block_id) is not None:
                        c.files.quarantine(c.files.block_path(e.block_id), e.message)
                    lost = sorted(set(c.index.block_users(e.block_id)) | {sid})
                    log.error("KV block %s is damaged: dropping the %d snapshot(s) using it", e.block_id, len(lost))
                    c.remove(lost)
                else:
                    c.files.quarantine(c.files.path(sid), e.message)
                    c.remove([sid])
            raise SnapshotCorrupt(e.message, hint="the session resumes from its transcript instead") from None
        except BaseException:
            with c.lock:
                c.done_reading(sid)
            raise
        with c.lock:
            c.done_reading(sid)
            if c.index.snapshot(sid) is not None and not c.closed:
                c.placement.put(sid, payload, payload_nbytes(payload))
                hit = c.placement.get(sid, touch=False)
                payload = hit[0] if hit else payload
        return _maybe_copy(payload, copy), "disk"

    def token_ids(self, snapshot_id: str) -> list[int] | None:
        """The token ids the snapshot's state has consumed (None when its payload does not record them);
        from memory, else from the file's token_ids tensor alone."""
        return self._core.token_ids(self.info(snapshot_id).id)

    def promote(self, snapshot_id: str) -> str | None:
        """Warm a snapshot into the hottest tier with room (e.g. when a client opens its session);
        returns the tier it ended in."""
        self.load(snapshot_id)
        with self._core.lock:
            return self._core.placement.where(snapshot_id)

    def info(self, snapshot_id: str) -> SnapshotRecord:
        with self._core.lock:
            return self._core.with_tiers(self._core.row(snapshot_id))

    def list(self, session: str | None = None) -> list[SnapshotRecord]:
        """Snapshots, oldest first; of one session (the ones it owns) if given."""
        c = self._core
        if session is not None:
            self._sessions.get(session)
        with c.lock:
            c.check_open()
            return [c.with_tiers(r) for r in c.index.snapshots(session)]

    def resolve_id(self, ref: str) -> str:
        """A full snapshot id from a full id or a unique prefix (the rule: names.parse_id_ref, one_id)."""
        ref = parse_id_ref(ref)
        if is_snapshot_id(ref):
            return ref
        with self._core.lock:
            found = self._core.index.ids_with_prefix(ref)
        return one_id(ref, found)

    # -- change --------------------------------------------------------------------------------------
    def delete(self, snapshot_id: str, *, force: bool = False) -> None:
        """Delete one snapshot. Refused (SnapshotInUse) if it is a session's head or branch point, or
        pinned, unless force=True; then those sessions fall back to its parent."""
        c = self._core
        with c.lock:
            rec = c.row(snapshot_id)
            users = c.index.referrers(rec.id)
            if users and not force:
                raise SnapshotInUse(
                    f"snapshot {rec.id} is the head or branch point of session(s) {', '.join(users)}.",
                    hint="restore those sessions to another snapshot, delete them, or force the delete",
                )
            if rec.pinned and not force:
                raise SnapshotInUse(f"snapshot {rec.id} is pinned.", hint="unpin it first, or force the delete")
            c.remove([rec.id])

    def files(self, snapshot_id: str) -> list[Path]:
        """The files a load of this snapshot from disk reads: its own, then its KV blocks in token order."""
        c = self._core
        with c.lock:
            sid = c.row(snapshot_id).id
            return [c.files.path(sid), *(c.files.block_path(b) for b in c.index.block_ids_of(sid))]

    def freed_bytes(self, snapshot_ids: list[str]) -> int:
        """What deleting these snapshots together frees on disk: their own files and the KV blocks no other
        snapshot or prefix state uses (what `snapshots rm` shows before it deletes)."""
        c = self._core
        with c.lock:
            return c.index.bytes_freed_by([c.row(sid).id for sid in snapshot_ids])

    def pin(self, snapshot_id: str) -> SnapshotRecord:
        return self._core.set(snapshot_id, pinned=1)

    def unpin(self, snapshot_id: str) -> SnapshotRecord:
        return self._core.set(snapshot_id, pinned=0)

    def label(self, snapshot_id: str, label: str | None) -> SnapshotRecord:
        return self._core.set(snapshot_id, label=None if label is None else validate_label(label))


def _maybe_copy(payload: Payload, copy: bool) -> Payload:
    if not copy:
        return payload
    tensors, meta = payload
    return {k: arrays.copy(t) for k, t in tensors.items()}, dict(meta)
