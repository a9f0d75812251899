"""Kill points for the crash tests: `crash_point("write.renamed")` SIGKILLs this process there, but only
when the test harness asked for it through ENGRAM_TEST_CRASH_AT; otherwise it is one comparison.

    ENGRAM_TEST_CRASH_AT="write.renamed,remove.unlinked:0.3"   names (or *), then the chance per pass
    ENGRAM_TEST_CRASH_SIGNAL=SIGILL                            another signal than SIGKILL (a CPU fault, say)

The variable is read once, at import, into an immutable value: a daemon started without it pays a
`None` check per point and nothing else. SIGKILL (not an exception) because that is what the tests
model: the process stops between two instructions, no finally block, no flush.

The points (where they sit says what state a kill there leaves):
  commit.indexed      the snapshot row and transcript are committed, the write not yet queued
  write.encoded       the file's bytes are built, nothing is on disk yet
  write.blocks_indexed  the snapshot's KV block references are in the index (new blocks' rows say not
                      durable), no block file is written yet
  write.blocks_written  the new KV block files are written and renamed, the snapshot's own file is not
  write.temp_written  (in snapshot_file.write_atomic) the temp file holds the bytes, not fsynced
  write.fsynced       (in write_atomic) the temp file is fsynced, not yet renamed to the snapshot's name
  write.replaced      (in write_atomic) the file is renamed into place, the directory not fsynced yet
  write.renamed       the file is complete and renamed, the row still says not durable
  write.indexed       the row says durable, keep-last retention has not run yet
  remove.unlinked     a deletion (eviction, retention, gc, delete) removed files, its rows still exist
  remove.blocks_indexed  a deletion's rows are gone, blocks nothing uses lost theirs; their files remain
  branch.indexed      a branch's session row is in its (uncommitted) transaction
  stream.piece        a reply is half streamed
  daemon.loading      the daemon holds its lock and says "loading"; the model is not loaded yet
"""

from __future__ import annotations

import os
import random
import signal

ENV = "ENGRAM_TEST_CRASH_AT"


def _parse(value: str | None) -> tuple[frozenset[str], float] | None:
    if not value:
        return None
    names, _, chance = value.partition(":")
    try:
        p = float(chance) if chance else 1.0
    except ValueError:
        p = 1.0
    return frozenset(n.strip() for n in names.split(",") if n.strip()), p


_ARMED = _parse(os.environ.get(ENV))
_SIGNAL = getattr(signal, os.environ.get("ENGRAM_TEST_CRASH_SIGNAL", "SIGKILL"), signal.SIGKILL)


def crash_point(name: str) -> None:
    """SIGKILL (or ENGRAM_TEST_CRASH_SIGNAL) this process here if the harness armed this point (and the dice say so)."""
    if _ARMED is None:
        return
    names, chance = _ARMED
    if (name in names or "*" in names) and random.random() < chance:
        os.kill(os.getpid(), _SIGNAL)
