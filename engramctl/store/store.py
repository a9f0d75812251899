"""The snapshot store: the one object the daemon talks to.

    store = Store.open(settings)                 # reconciles, plans tiers, starts the writer
    rec = store.commit("chat", payload, messages=[{"role": "user", "content": "hi"}])
    tensors, meta = store.load(rec.id)           # hottest tier that has it, else disk (verified)
    store.flush(); store.close()

Durability: `commit` puts the payload in the hottest memory tier with room and queues the disk
write; the record says `durable=False` until the file is complete (`flush()` waits, `info()` tells).
A snapshot that cannot be written (disk budget, I/O error) is dropped exactly as if the process had
stopped before writing it: heads fall back to its parent, the transcript is untouched.

Ownership: the store keeps the payload's tensors as given (no copy), so the caller must not mutate
them afterwards; `load` returns the stored tensors (read-only by contract) unless copy=True.
Threads: every method is safe to call from any thread; file I/O happens outside the lock.

API (errors: InvalidName for bad names/ids, NotFound, SnapshotCorrupt, store.errors.SnapshotInUse /
AlreadyExists / StoreLocked):
  open(settings, clock, hardware, *, model_bytes, model_on_cpu, verify) / close() / flush(timeout)
  sessions:    create_session, get_session, list_sessions, touch_session, head, history, delete_session,
               branch(source_session_or_snapshot_id, new_session), set_head(session, id|None),
               reset_session(session)
  transcripts: append_messages, transcript, snapshot_transcript, set_transcript, truncate_transcript
  snapshots:   commit, wait_durable, load, token_ids, promote, info, list, resolve, delete, pin, unpin, label,
               find_prefix(token_ids, fingerprint, session=None)
  names:       (the Engram server's, aliases.py) turns, find_turn, turn_snapshot, name_turn, turn_numbers,
               name_snapshot, named, custom_ids, is_snapshot_name, save_branch, branch_session, branches
  tiers:       usage(), plan_json(), replan(model_bytes, model_on_cpu), plan (TierPlan),
               claim_tables(tables, tier) (the loaded model's N-gram tables; replan keeps them)
  maintenance: gc(), verify(), reconcile_report, write_errors, pending_writes
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, Sequence

from engramctl.errors import NotFound, SnapshotCorrupt, UsageError
from engramctl.settings import Settings
from engramctl.store.aliases import AliasesMixin
from engramctl.store.crashpoints import crash_point
from engramctl.store.errors import SnapshotInUse
from engramctl.store.files import SnapshotFiles
from engramctl.store.index import Index
from engramctl.store.names import (
    is_snapshot_id,
    new_snapshot_id,
    one_id,
    parse_id_ref,
    parse_turn_ref,
    validate_label,
    validate_session_name,
    validate_snapshot_id,
)
from engramctl.store.persist import PersistMixin
from engramctl.store.prefix import prefix_hashes, token_hash
from engramctl.store.reconcile import reconcile
from engramctl.store.records import GcReport, Payload, SnapshotRecord, check_payload, payload_nbytes
from engramctl.store.sessions import SessionsMixin
from engramctl.tiers.hardware import Hardware, detect_hardware
from engramctl.tiers.plan import claim_tables, plan


class Store(SessionsMixin, PersistMixin, AliasesMixin):
    @classmethod
    def open(
        cls,
        settings: Settings,
        clock: Callable[[], float] = time.time,
        hardware: Hardware | None = None,
        *,
        model_bytes: int = 0,
        model_on_cpu: bool = True,
        verify: bool = False,
    ) -> "Store":
        """Open (creating if needed) the store under settings.paths.data_dir, reconcile it with its
        files (verify=True also checks every checksum), and plan the tiers from `hardware`."""
        files = SnapshotFiles(settings.paths.data_dir)
        files.lock()
        index = None
        try:
            index = Index(files.index_path)
            report = reconcile(index, files, verify=verify)
            hw = hardware or detect_hardware(settings.paths.data_dir)
            tier_plan = plan(hw, settings, model_bytes, model_on_cpu, stored_disk_bytes=index.durable_bytes()[0])
            store = cls(settings, files, index, tier_plan, clock, report)
        except BaseException:
            if index is not None:
                index.close()
            files.unlock()
            raise
        with store._lock:  # a lowered disk budget applies from the start
            store._enforce_disk(GcReport())
        return store

    def close(self) -> None:
        """Finish pending writes, then release everything. Idempotent."""
        if self._closed:
            return
        self._writer.close()
        with self._lock:
            self._flush_touches()
            self._closed = True
            self._index.close()
        self._files.unlock()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every committed snapshot is durable (or dropped); False on timeout."""
        done = self._writer.flush(timeout)
        with self._lock:
            if not self._closed:
                self._flush_touches()
        return done

    # -- N-gram tables ---------------------------------------------------------------------------------
    def claim_tables(self, tables: Sequence[tuple[str, int]], tier: str | None = None) -> dict[str, str]:
        """Place the loaded model's N-gram tables ((name, size_bytes), earliest layer first) on the tier
        budgets (tiers.plan.claim_tables; `tier` forces one) and keep them there across replan().
        Returns name -> "ram" | "disk"; NgramTableError when one fits nowhere."""
        with self._lock:
            new = claim_tables(self.plan, tables, tier)
            self._table_claims = new.tables
            self._apply_plan(new)
        return {c.name: c.tier for c in new.tables}

    # -- snapshots -----------------------------------------------------------------------------------
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
        validate_session_name(session)
        label = None if label is None else validate_label(label)
        parent = None if parent is None else validate_snapshot_id(parent)
        ids, n_tokens = check_payload(payload)
        tensors, meta = payload
        nbytes = payload_nbytes(payload)
        with self._lock:
            self._check_open()
            self._check_disk_room(nbytes)
            now = self.clock()
            with self._index.tx():
                sess = self._ensure_session(session, now)
                tip = self._index.session_tip(session)
                if messages:
                    tip = self._transcripts.append(tip, messages)
                if parent is not None:
                    self._row(parent)
                parent = parent if parent is not None else sess.head
                sid = new_snapshot_id(now)
                meta = {
                    **meta,
                    "n_tokens": str(n_tokens),
                    "snapshot_id": sid,
                    "session": session,
                    "parent": parent or "",
                    "created": repr(now),
                }
                self._index.insert_snapshot(
                    id=sid,
                    session=session,
                    parent=parent,
                    n_tokens=n_tokens,
                    nbytes=nbytes,
                    token_hash=None if ids is None else token_hash(ids),
                    fingerprint=meta.get("fingerprint"),
                    model_id=meta.get("model_id"),
                    tip=tip,
                    n_messages=self._transcripts.depth(tip),
                    created=now,
                    last_access=now,
                    pinned=int(pinned),
                    label=label,
                    durable=0,
                )
                self._index.update_session(
                    session,
                    head=sid,
                    tip=tip,
                    fingerprint=meta.get("fingerprint"),
                    model_id=meta.get("model_id"),
                    last_used=now,
                )
            self._placement.hold(sid)
            self._placement.put(sid, (tensors, meta), nbytes)
            hot = self._placement.get(sid, touch=False)  # the writer uses the tier's copy: no second one
            self._pending[sid] = hot[0] if hot else (tensors, meta)
            record = self._with_tiers(self._index.snapshot(sid))  # type: ignore[arg-type]
        crash_point("commit.indexed")
        self._writer.submit(partial(self._write, sid))
        return record

    def load(self, snapshot_id: str, *, copy: bool = False) -> Payload:
        """The snapshot's payload from the hottest tier holding it, else from disk (checksum
        verified), promoting it. A corrupt file is quarantined and SnapshotCorrupt raised (the
        session's head falls back; its transcript is intact)."""
        return self.load_from(snapshot_id, copy=copy)[0]

    def load_from(self, snapshot_id: str, *, copy: bool = False) -> tuple[Payload, str]:
        """load(), and where the payload came from: a memory tier's name ("vram", "ram"), "pending"
        (saved, not yet written) or "disk" (read from its file now). A payload from memory is the one
        this process saved or already read back, so it needs no second look at its values."""
        with self._lock:
            rec = self._row(snapshot_id)
            sid = rec.id
            self._touched[sid] = self.clock()
            if self._placement.where(sid) is not None:
                self._placement.promote(sid)
                payload, tier = self._placement.get(sid, touch=False)  # type: ignore[misc]
                return _maybe_copy(payload, copy), tier
            if sid in self._pending:
                return _maybe_copy(self._pending[sid], copy), "pending"
            self._reading[sid] += 1
            self._placement.hold(sid)
        try:
            payload = self._files.read(sid)
        except SnapshotCorrupt as e:
            with self._lock:
                self._done_reading(sid)
                if self._index.snapshot(sid) is None:
                    raise NotFound(f"snapshot {sid} was deleted while it was being loaded.") from None
                self._files.quarantine(self._files.path(sid), e.message)
                self._remove([sid])
            raise SnapshotCorrupt(e.message, hint="the session resumes from its transcript instead") from None
        except BaseException:
            with self._lock:
                self._done_reading(sid)
            raise
        with self._lock:
            self._done_reading(sid)
            if self._index.snapshot(sid) is not None and not self._closed:
                self._placement.put(sid, payload, payload_nbytes(payload))
                hit = self._placement.get(sid, touch=False)
                payload = hit[0] if hit else payload
        return _maybe_copy(payload, copy), "disk"

    def token_ids(self, snapshot_id: str) -> list[int] | None:
        """The token ids the snapshot's state has consumed (None when its payload does not record them);
        from memory, else from the file's token_ids tensor alone."""
        return self._token_ids(self.info(snapshot_id).id)

    def promote(self, snapshot_id: str) -> str | None:
        """Warm a snapshot into the hottest tier with room (e.g. when a client opens its session);
        returns the tier it ended in."""
        self.load(snapshot_id)
        with self._lock:
            return self._placement.where(snapshot_id)

    def info(self, snapshot_id: str) -> SnapshotRecord:
        with self._lock:
            return self._with_tiers(self._row(snapshot_id))

    def list(self, session: str | None = None) -> list[SnapshotRecord]:
        """Snapshots, oldest first; of one session (the ones it owns) if given."""
        if session is not None:
            self.get_session(session)
        with self._lock:
            self._check_open()
            return [self._with_tiers(r) for r in self._index.snapshots(session)]

    def resolve(self, ref: str) -> str:
        """A full snapshot id from a full id or a unique prefix (the rule: names.parse_id_ref, one_id), or
        from a name the Engram routes gave it (aliases.py): a custom snapshot id (looked up first: a
        client's own name wins over an id prefix that reads the same), "<conversation_id>-t<N>"."""
        if isinstance(ref, str) and ref and not is_snapshot_id(ref):
            named = self.named(ref)
            if named is not None:
                return named
        try:
            ref = parse_id_ref(ref)
        except UsageError:
            turn = parse_turn_ref(ref)
            if turn is None:
                raise
            return self.turn_snapshot(*turn)
        if is_snapshot_id(ref):
            return ref
        with self._lock:
            found = self._index.ids_with_prefix(ref)
        return one_id(ref, found)

    def delete(self, snapshot_id: str, *, force: bool = False) -> None:
        """Delete one snapshot. Refused (SnapshotInUse) if it is a session's head or branch point, or
        pinned, unless force=True; then those sessions fall back to its parent."""
        with self._lock:
            rec = self._row(snapshot_id)
            users = self._index.referrers(rec.id)
            if users and not force:
                raise SnapshotInUse(
                    f"snapshot {rec.id} is the head or branch point of session(s) {', '.join(users)}.",
                    hint="restore those sessions to another snapshot, delete them, or force the delete",
                )
            if rec.pinned and not force:
                raise SnapshotInUse(f"snapshot {rec.id} is pinned.", hint="unpin it first, or force the delete")
            self._remove([rec.id])

    def pin(self, snapshot_id: str) -> SnapshotRecord:
        return self._set(snapshot_id, pinned=1)

    def unpin(self, snapshot_id: str) -> SnapshotRecord:
        return self._set(snapshot_id, pinned=0)

    def label(self, snapshot_id: str, label: str | None) -> SnapshotRecord:
        return self._set(snapshot_id, label=None if label is None else validate_label(label))

    def find_prefix(
        self, token_ids: Sequence[int], fingerprint: str, session: str | None = None
    ) -> tuple[SnapshotRecord, int] | None:
        """The longest stored snapshot (of `fingerprint`, optionally of one session) whose token ids
        are an exact prefix of `token_ids`, and how many tokens it covers. Ids are compared, not
        only hashed."""
        ids = [int(t) for t in token_ids]
        if session is not None:
            validate_session_name(session)
        with self._lock:
            self._check_open()
            lengths = self._index.prefix_lengths(fingerprint, len(ids), session)
        hashes = prefix_hashes(ids, lengths)
        with self._lock:
            candidates = self._index.prefix_candidates(fingerprint, hashes, session) if hashes else []
        for rec in candidates:
            if self._token_ids(rec.id) == ids[: rec.n_tokens]:
                with self._lock:
                    current = self._index.snapshot(rec.id)
                    if current is not None:
                        return self._with_tiers(current), rec.n_tokens
        return None

    def wait_durable(self, snapshot_id: str, timeout: float | None = None) -> SnapshotRecord:
        """Block until this snapshot's file is complete; returns its record (durable=False only if
        `timeout` ran out). Raises NotFound if it was dropped because it could not be written."""
        sid = self.info(snapshot_id).id
        self._writer.wait_until(lambda: sid not in self._pending, timeout)
        with self._lock:
            rec = self._index.snapshot(sid)
            if rec is None:
                why = next((e for e in reversed(self.write_errors) if sid in e), "it was deleted")
                raise NotFound(f"snapshot {sid} was not saved: {why}")
            return self._with_tiers(rec)

    @property
    def pending_writes(self) -> int:
        return self._writer.pending


def _maybe_copy(payload: Payload, copy: bool) -> Payload:
    if not copy:
        return payload
    tensors, meta = payload
    return {k: t.clone() for k, t in tensors.items()}, dict(meta)
