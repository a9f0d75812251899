"""Sessions and snapshots as the CLI shows them, whichever source read them (the daemon, or the store).

A row is a protocol object's fields by their own names (what `--json` prints), plus what the CLI
works out from the whole listing: the sessions that need a snapshot (`head_of`, `branch_point_of`);
a session's row also says its stored bytes as `nbytes`. A snapshot row's lists (`tiers`, `head_of`,
`branch_point_of`) are tuples: JSON arrays all the same, and rows may share them (store/listing.py's 10,000 rows
share one `("disk",)` and one `()`: a new list each was ~4% of `snapshots ls --json`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from engramctl.protocol import Session


def snapshot_rows(snaps: Iterable[dict], sessions: Iterable[tuple[str, str | None, str | None]]) -> list[dict]:
    """`snaps`: Snapshot.to_dict()'s, made the rows in place. `sessions`: each session's (name, head, base), in
    the order `head_of` and `branch_point_of` list them."""
    from engramctl.store.listing import referrers

    heads, bases = referrers(sessions)
    rows = list(snaps)
    for row in rows:
        sid = row["id"]
        row["tiers"] = tuple(row["tiers"])
        row["head_of"] = heads.get(sid, ())
        row["branch_point_of"] = bases.get(sid, ())
    return rows


def session_rows(sessions: Iterable[Session], hot: set[str] | None = None) -> list[dict]:
    """`hot`: the sessions whose state the daemon holds in memory (None: not known, no daemon)."""
    rows = []
    for s in sessions:
        row = {**s.to_json(), "nbytes": s.stored_bytes}  # the blocks its snapshots share counted once
        if hot is not None:
            row["hot"] = s.name in hot
        rows.append(row)
    return rows
