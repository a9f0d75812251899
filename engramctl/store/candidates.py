"""Which stored states a prompt could start from (a Store part: `store.candidates`): session snapshots and prefix
states alike, in one query.

    found = store.candidates.find(prompt_ids, fingerprint, state={"dtype": "float32", "state_format": "2"})
    # [Candidate(id, kind, session, n_tokens, size_bytes, tier), ...]: longest first, every one verified

The index keeps, per state, a hash of its whole token-id sequence (store/prefix.py). A lookup hashes each prefix
of the prompt whose length some stored state of the model has (one incremental pass), fetches the rows with a
matching (hash, length), and then checks each: its actual ids are compared with the prompt's (a hash only
nominates), and its metadata must be of the caller's dtype and state format (`state`), since the model
fingerprint is dtype-independent (engine/fingerprint.py) and a state of another dtype or format would only be
refused once loaded. Which one to load is not decided here: daemon/state_cache.py ranks them by restore cost.
Nothing is marked used.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Collection, Mapping, Sequence

from engramctl.errors import SnapshotCorrupt
from engramctl.store import snapshot_file
from engramctl.store.core import StoreCore
from engramctl.store.prefix import prefix_hashes

KINDS = ("snapshot", "prefix")  # a session's snapshot, a prefix state (store/prefixes.py)
_CHUNK = 500  # hashes per IN (...) list: under SQLite's parameter limit


@dataclass(frozen=True)
class Candidate:
    """A stored state whose token ids are exactly the prompt's first `n_tokens`."""

    id: str
    kind: str  # "snapshot" | "prefix"
    session: str  # the owning session; "" for a prefix state
    n_tokens: int
    size_bytes: int  # what a load from disk reads: its own file and its KV blocks (the payload before it is written)
    tier: str  # the hottest place holding it: "vram", "ram", "pending" (in memory, not yet written) or "disk"


class Candidates:
    def __init__(self, core: StoreCore):
        self._core = core

    def find(
        self,
        token_ids: Sequence[int],
        fingerprint: str | None,
        *,
        state: Mapping[str, str] | None = None,
        kinds: Sequence[str] = KINDS,
        session: str | None = None,
        exclude: Collection[str] = (),
        min_tokens: int = 1,
        limit: int | None = None,
    ) -> list[Candidate]:
        """The stored states (of `kinds`; of one `session`'s snapshots, if given) of model `fingerprint` whose
        token ids are an exact prefix of `token_ids` (all of them counts), at least `min_tokens` long, longest
        then newest first; at most `limit` of them. `state`: metadata values a candidate must have where its
        metadata records them (dtype, state_format). `exclude`: ids the caller already refused. None is the
        fingerprint of any model (from_payload then refuses another's)."""
        ids = [int(t) for t in token_ids]
        kinds = tuple(k for k in KINDS if k in kinds)
        if not ids or not kinds:
            return []
        c = self._core
        where, params = _where(kinds, fingerprint, session)
        with c.lock:
            c.check_open()
            lengths = [
                r[0]
                for r in c.index.rows(
                    f"SELECT DISTINCT n_tokens FROM snapshots WHERE {where} AND n_tokens BETWEEN ? AND ?",
                    [*params, max(1, min_tokens), len(ids)],
                )
            ]
        hashes = prefix_hashes(ids, lengths)
        rows = []
        keys = list(hashes)
        with c.lock:
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i : i + _CHUNK]
                rows += c.index.rows(
                    "SELECT id, kind, session, n_tokens, nbytes, token_hash FROM snapshots "
                    f"WHERE {where} AND token_hash IN ({','.join('?' * len(chunk))})",
                    [*params, *chunk],
                )
        rows = [r for r in rows if hashes.get(r["token_hash"]) == r["n_tokens"] and r["id"] not in exclude]
        rows.sort(key=lambda r: (r["n_tokens"], r["id"]), reverse=True)
        found: list[Candidate] = []
        for r in rows:
            if limit is not None and len(found) >= limit:
                break
            if c.token_ids(r["id"]) != ids[: r["n_tokens"]] or not self._of_state(r["id"], state):
                continue
            with c.lock:
                if c.index.snapshot(r["id"]) is None:  # deleted since
                    continue
                tier = c.placement.where(r["id"]) or ("pending" if r["id"] in c.pending else "disk")
            found.append(Candidate(r["id"], r["kind"], r["session"], r["n_tokens"], r["nbytes"], tier))
        return found

    def _of_state(self, sid: str, state: Mapping[str, str] | None) -> bool:
        """Does the stored state record the same values of `state`'s keys (a key it does not record passes)?"""
        if not state:
            return True
        meta = self._meta(sid)
        if meta is None:
            return False
        return all(not meta.get(k) or meta[k] == v for k, v in state.items())

    def _meta(self, sid: str) -> Mapping[str, str] | None:
        """Its metadata: from memory, else its file's header alone (None when the file cannot be read: a load
        would quarantine it)."""
        c = self._core
        with c.lock:
            hit = c.placement.get(sid, touch=False)
            payload = hit[0] if hit else c.pending.get(sid)
            if payload is not None:
                return payload[1]
            path = c.files.path(sid)
        try:
            return snapshot_file.read_metadata(path)
        except (SnapshotCorrupt, OSError):
            return None


def _where(kinds: tuple[str, ...], fingerprint: str | None, session: str | None) -> tuple[str, list]:
    where, params = f"kind IN ({','.join('?' * len(kinds))})", list(kinds)
    if fingerprint is not None:
        where, params = where + " AND fingerprint = ?", params + [fingerprint]
    if session is not None:
        where, params = where + " AND session = ?", params + [session]
    return where, params
