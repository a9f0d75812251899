"""One request's turn, from admission to its recorded result: the one object the daemon keeps per turn.

The conversation service plans it (daemon/service.py: which state continues the prompt, what the turn adds
to the session), the scheduler steps its `turn` with the others (daemon/scheduler.py), the service handles
each event the turn returns with it (`ConversationService.handle`), and the worker finishes its `job` with
the recorded `result` (or the error). It is nano-vllm's Sequence with a session.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from engramctl.daemon.recorder import TurnRecord
from engramctl.daemon.state_cache import Origin
from engramctl.daemon.turn_result import TurnResult
from engramctl.engine.turn import Turn

if TYPE_CHECKING:
    from engramctl.daemon.job import Job


@dataclass(eq=False)
class Sequence:
    turn: Turn  # the engine's state machine: what to feed, and what happened
    session: str  # the session it records into
    origin: Origin  # where its state came from
    record: TurnRecord  # what it adds to the session, and how far recording has got
    started_at: float  # time.perf_counter() when the worker took the request
    job: Job | None = None  # whoever asked (None: a turn run alone, ConversationService.run)
    answer: Callable[[TurnResult], Any] | None = None  # the job's result from the recorded TurnResult (a route's own)
    result: TurnResult | None = None  # the turn's result as far as it has got (turn_result.py)
    error: BaseException | None = None  # handling one of its events failed: the scheduler drops it
    _cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def cancel(self) -> threading.Event:
        """Set by the client going away, a cancel message or the daemon stopping: the turn ends at its next step."""
        return self._cancel if self.job is None else self.job.cancel

    def emit(self, kind: str, value: Any) -> None:
        """Hand an event to the route reading the job (nobody reads a turn run alone)."""
        if self.job is not None:
            self.job.emit(kind, value)

    def needs(self) -> str | None:
        """The snapshot its record continues from now (a delete of it waits for the turn)."""
        return self.record.head if self.record.prompted else self.record.parent
