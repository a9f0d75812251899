"""The hot state: the most recently used conversation's Live, kept in memory so that its next turn
restores nothing.

A Live the daemon stops needing is released (engine.release: a llama.cpp backend frees its sequence),
but only on the worker thread, the one thread that runs the model: routes on the event loop may drop
the hot state (a session deleted) while a turn runs, so a dropped Live is set aside ("retired") and
released by the worker's next `release_retired`. A turn `take`s the Live it continues, so nothing
releases a Live in use, and one kept hot again is never released.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine


@dataclass(frozen=True)
class Hot:
    """`session`'s state at snapshot `head`."""

    session: str
    head: str | None
    live: Live


class HotState:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hot: Hot | None = None
        self._retired: list[Live] = []

    @property
    def current(self) -> Hot | None:
        return self._hot

    def live_for(self, session: str, head: str | None) -> Live | None:
        """The hot Live if it is `session`'s state at `head` (it stays hot until a turn takes it)."""
        hot = self._hot
        if hot is not None and head is not None and hot.session == session and hot.head == head:
            return hot.live
        return None

    def take(self, live: Live) -> None:
        """`live` is about to change: if it is the hot state, it stops being a valid copy of its head."""
        with self._lock:
            if self._hot is not None and self._hot.live is live:
                self._hot = None
            self._unretire(live)

    def put(self, hot: Hot) -> None:
        """Keep `hot`; the Live it replaces is retired."""
        with self._lock:
            old, self._hot = self._hot, hot
            self._unretire(hot.live)
            if old is not None and old.live is not hot.live:
                self._retired.append(old.live)

    def drop(self, session: str | None = None) -> None:
        """Forget the hot state (of `session`, or whichever); its Live is retired. Any thread."""
        with self._lock:
            if self._hot is not None and (session is None or self._hot.session == session):
                self._retired.append(self._hot.live)
                self._hot = None

    def release_retired(self, engine: Engine) -> None:
        """Release the retired Lives. Worker thread only."""
        with self._lock:
            lives, self._retired = self._retired, []
        for live in lives:
            engine.release(live)

    def _unretire(self, live: Live) -> None:
        self._retired = [x for x in self._retired if x is not live]
