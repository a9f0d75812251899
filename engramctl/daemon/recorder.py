"""Recording a turn: the prompt snapshot, the reply snapshot (the session's new head) and the transcript.

Commits put the payload in a memory tier and queue the disk write on the store's writer thread, so
nothing heavy happens between the last token and the end of the stream. Failing to snapshot never
loses the conversation: the transcript is recorded regardless, and the next turn re-prefills it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from engramctl.engine.engine import Engine
from engramctl.engine.turn import TurnDone
from engramctl.state import SessionState
from engramctl.state.codec import to_payload
from engramctl.store.records import SnapshotRecord
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")


@dataclass(frozen=True)
class Recorded:
    prompt_id: str | None  # the prompt snapshot (None: nothing was computed for the prompt)
    reply_id: str | None  # the reply snapshot, the session's new head (None: snapshotting failed)
    started_at: float  # time.perf_counter() when the commits began
    ended_at: float  # ... and when the turn was recorded (snapshots committed, transcript written)


@dataclass(frozen=True)
class TurnRecord:
    """What a turn adds to a session."""

    session: str
    parent: str | None  # the snapshot the turn continued from
    new_messages: list[dict]  # the request's messages the transcript does not have yet
    replace_transcript: list[dict] | None = None  # anonymous turns: the transcript is the request
    before_commit: Callable[[], Any] | None = None  # a restore's head move, applied when recording


class Recorder:
    def __init__(self, engine: Engine, store: Store):
        self.engine, self.store = engine, store

    def turn(self, r: TurnRecord, done: TurnDone) -> Recorded:
        t0 = time.perf_counter()
        finish = done.finish
        reply = {"role": "assistant", "content": finish.text, "finish_reason": finish.reason}
        unrecorded = list(r.new_messages) + [reply]
        head, prompt_id = r.parent, None
        try:
            if r.before_commit is not None:
                r.before_commit()
            if r.replace_transcript is not None:
                self.store.set_transcript(r.session, r.replace_transcript)
            if done.prompt.state is not None:
                prompt_id = self.commit(r.session, done.prompt.state, "prompt", head, unrecorded[:-1]).id
                head, unrecorded = prompt_id, unrecorded[-1:]
            if done.reply_state is None:
                raise ValueError("the turn captured no reply state")
            head = self.commit(r.session, done.reply_state, "reply", head, unrecorded).id
            return Recorded(prompt_id, head, t0, time.perf_counter())
        except Exception as e:  # noqa: BLE001 - a snapshot failure must not lose the turn
            log.error("session %s: could not snapshot the turn (%s); the transcript keeps it", r.session, e)
            if unrecorded:
                try:
                    self.store.append_messages(r.session, unrecorded)
                except Exception as e2:  # noqa: BLE001
                    log.error("session %s: could not record the transcript either: %s", r.session, e2)
            return Recorded(prompt_id, None, t0, time.perf_counter())

    def commit(
        self,
        session: str,
        state: SessionState,
        stage: str,
        parent: str | None = None,
        messages: list[dict] | None = None,
    ) -> SnapshotRecord:
        payload = to_payload(state, self.engine.spec, {"stage": stage})
        return self.store.commit(session, payload, parent=parent, messages=messages)
