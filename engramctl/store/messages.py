"""Messages: the tree of immutable chat messages in the index that transcripts are made of.

A message row holds one chat message (JSON text, never pickle), its parent and its depth (1-based
position in the conversation). A transcript is identified by its last message, the "tip"; reading it
walks parents to the root. So a branch shares its source's messages, a restore just moves the tip
back, and a snapshot records the tip it corresponds to. Messages that no session or snapshot can reach
are removed by `collect`. MessageTree is that tree (tips in, tips out); store/transcript.py reads and
changes a session's or a snapshot's transcript through it.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from engramctl.errors import UsageError
from engramctl.store.index import Index

MAX_MESSAGE_BYTES = 16 * 2**20

_CHAIN = """
    WITH RECURSIVE chain(id, parent, depth, body) AS (
        SELECT id, parent, depth, body FROM messages WHERE id = ?
        UNION ALL
        SELECT m.id, m.parent, m.depth, m.body FROM messages m JOIN chain c ON m.id = c.parent
    )
"""


def _encode(message: Any) -> str:
    if not isinstance(message, dict):
        raise UsageError(f"a transcript message must be a JSON object, not {type(message).__name__}.")
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UsageError(f"a transcript message is not JSON-serializable ({e}).") from None
    if len(text.encode()) > MAX_MESSAGE_BYTES:
        raise UsageError(f"a transcript message is larger than {MAX_MESSAGE_BYTES // 2**20} MiB.")
    return text


class MessageTree:
    def __init__(self, index: Index):
        self._index = index

    def depth(self, tip: int | None) -> int:
        if tip is None:
            return 0
        row = self._index.one("SELECT depth FROM messages WHERE id = ?", (tip,))
        return 0 if row is None else int(row["depth"])

    def read(self, tip: int | None, limit: int | None = None) -> list[dict]:
        """The messages from the root to `tip` (the first `limit` of them if given)."""
        if tip is None:
            return []
        sql = (
            _CHAIN + " SELECT body FROM chain" + (" WHERE depth <= ?" if limit is not None else "") + " ORDER BY depth"
        )
        params = (tip, limit) if limit is not None else (tip,)
        return [json.loads(r["body"]) for r in self._index.rows(sql, params)]

    def append(self, tip: int | None, messages: Sequence[dict]) -> int | None:
        """Add messages after `tip`; returns the new tip. Validates all before writing any."""
        return self._append(tip, [_encode(m) for m in messages])

    def _append(self, tip: int | None, bodies: list[str]) -> int | None:
        with self._index.tx():
            depth = self.depth(tip)
            for body in bodies:
                depth += 1
                cur = self._index.execute(
                    "INSERT INTO messages (parent, depth, body) VALUES (?, ?, ?)", (tip, depth, body)
                )
                tip = cur.lastrowid
        return tip

    def ancestor(self, tip: int | None, depth: int) -> int | None:
        """The message at `depth` on the chain ending at `tip` (None for depth 0)."""
        have = self.depth(tip)
        if depth < 0 or depth > have:
            raise UsageError(f"the transcript has {have} messages; cannot cut it at {depth}.")
        if depth == 0:
            return None
        row = self._index.one(_CHAIN + " SELECT id FROM chain WHERE depth = ?", (tip, depth))
        return int(row["id"])

    def replace(self, tip: int | None, messages: Sequence[dict]) -> int | None:
        """Tip of a transcript equal to `messages`, reusing the longest common prefix with `tip`'s."""
        bodies = [_encode(m) for m in messages]
        with self._index.tx():
            rows = self._index.rows(_CHAIN + " SELECT id, body FROM chain ORDER BY depth", (tip,)) if tip else []
            common, new_tip = 0, None
            for row, body in zip(rows, bodies):
                if row["body"] != body:
                    break
                common, new_tip = common + 1, int(row["id"])
            return self._append(new_tip, bodies[common:])

    def collect(self) -> int:
        """Delete messages no session or snapshot reaches; returns how many."""
        with self._index.tx():
            self._index.execute(
                """
            WITH RECURSIVE live(id) AS (
                SELECT tip FROM sessions WHERE tip IS NOT NULL
                UNION SELECT tip FROM snapshots WHERE tip IS NOT NULL
                UNION SELECT m.parent FROM messages m JOIN live ON m.id = live.id WHERE m.parent IS NOT NULL
            )
            DELETE FROM messages WHERE id NOT IN (SELECT id FROM live)
            """
            )
            return int(self._index.one("SELECT changes()")[0])
