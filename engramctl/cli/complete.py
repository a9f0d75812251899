"""Shell-completion values from the local index: session names and snapshot ids.

Completion runs on every Tab press, so this reads the SQLite index read-only with the standard
library only (the store package imports torch). Any problem yields no candidates, never an error.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def _index_path() -> Path | None:
    try:
        from engramctl.paths import Paths

        path = Paths.from_env(os.environ).data_dir / "index.db"
    except Exception:
        return None
    return path if path.is_file() else None


def _query(sql: str, params: tuple = ()) -> list[str]:
    path = _index_path()
    if path is None:
        return []
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=0.5)
        try:
            return [str(r[0]) for r in db.execute(sql, params).fetchall()]
        finally:
            db.close()
    except sqlite3.Error:
        return []


def session_names(incomplete: str = "") -> list[str]:
    return _query(
        "SELECT name FROM sessions WHERE name LIKE ? ESCAPE '\\' ORDER BY last_used DESC", (_like(incomplete),)
    )


def snapshot_ids(incomplete: str = "") -> list[str]:
    return _query("SELECT id FROM snapshots WHERE id LIKE ? ESCAPE '\\' ORDER BY id DESC", (_like(incomplete.lower()),))


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# Typer autocompletion callbacks (they receive the incomplete word).
def complete_session(incomplete: str) -> list[str]:
    return session_names(incomplete)


def complete_snapshot(incomplete: str) -> list[str]:
    return snapshot_ids(incomplete)


def complete_session_or_snapshot(incomplete: str) -> list[str]:
    return session_names(incomplete) + snapshot_ids(incomplete)
