"""Hashes of token-id sequences, for finding stored snapshots whose tokens are a prefix of a prompt.

The index keeps, per snapshot, a hash of its whole token-id sequence. To look up a prompt we hash
each of its prefixes whose length some stored snapshot has (one incremental sha256 pass), fetch the
snapshots with a matching (hash, length), and then compare the actual ids: a hash only nominates
candidates, it never decides a match.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

from engramctl.store.blocks import id_bytes

_DOMAIN = b"engram-token-ids-v1\0"


def token_hash(ids: Sequence[int]) -> str:
    h = hashlib.sha256(_DOMAIN)
    h.update(id_bytes(ids))
    return h.hexdigest()[:32]


def prefix_hashes(ids: Sequence[int], lengths: Iterable[int]) -> dict[str, int]:
    """{hash of ids[:n]: n} for each n in `lengths` with 0 < n <= len(ids), in one pass."""
    h = hashlib.sha256(_DOMAIN)
    out: dict[str, int] = {}
    done = 0
    for n in sorted(set(lengths)):
        if n <= 0 or n > len(ids):
            continue
        h.update(id_bytes(ids[done:n]))
        done = n
        out[h.copy().hexdigest()[:32]] = n
    return out
