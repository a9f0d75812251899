"""Recording a turn: the prompt snapshot, the reply snapshot (the session's new head) and the transcript.

Commits put the payload in a memory tier and queue the disk write on the store's writer thread, so
nothing heavy happens between the last token and the end of the stream. The prompt snapshot is
committed once the prompt is in the state and the first token is on its way (`prompt`, at the
turn's PromptState event: the copy and the commit do not delay the first token), so its file is written
while the reply is generated: after the reply's last token only the reply snapshot is
left to write, which halves the window in which a crash loses the turn's snapshots (two ~35 MB writes after
the last token took 0.5-1.15 s on the 350M preset at 2-3k tokens, docs/history/reliability-2026.md; one takes
p50 307 ms now, RELIABILITY.md section 3).
Failing to snapshot never loses the conversation: the transcript is recorded regardless, the next
turn re-prefills it, and the failure is in the turn's record (`TurnRecord.error`, reported as the result's
snapshot_error) and the log.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from engramctl.engine.engine import Engine
from engramctl.engine.turn import Prompt, TurnDone
from engramctl.errors import EngramError
from engramctl.state import SessionState
from engramctl.state.codec import to_payload
from engramctl.store.records import SnapshotRecord
from engramctl.store.store import Store

log = logging.getLogger("engramctl.daemon")


@dataclass
class TurnRecord:
    """What a turn adds to a session, and how far recording it has got (the Recorder fills in the rest)."""

    session: str
    parent: str | None  # the snapshot the turn continued from
    new_messages: list[dict]  # the request's messages the transcript does not have yet
    replace_transcript: list[dict] | None = None  # anonymous turns: the transcript is the request
    before_commit: Callable[[], Any] | None = None  # a restore's head move, applied when recording
    # filled in by Recorder.prompt, then Recorder.turn
    prompted: bool = False
    head: str | None = None  # where the reply snapshot continues from: the prompt snapshot, else the parent
    prompt_id: str | None = None  # the prompt snapshot (None: nothing was computed for the prompt)
    reply_id: str | None = None  # the reply snapshot, the session's new head (None: snapshotting failed)
    unrecorded: list[dict] = field(default_factory=list)  # messages the transcript still lacks
    error: str | None = None  # why the turn could not be snapshotted
    started_at: float | None = None  # time.perf_counter() when the commits began
    ended_at: float | None = None  # ... and when the turn was recorded


class Recorder:
    def __init__(self, engine: Engine, store: Store):
        self.engine, self.store = engine, store

    def prompt(self, r: TurnRecord, prompt: Prompt) -> None:
        """Record the turn's start: a restore's head move, an anonymous turn's transcript, the prompt
        snapshot with the request's messages. Called once the prompt is in the state, before generating."""
        r.prompted, r.started_at = True, time.perf_counter()
        r.head, r.unrecorded = r.parent, list(r.new_messages)
        try:
            if r.before_commit is not None:
                r.before_commit()
            if r.replace_transcript is not None:
                self.store.transcripts.replace(r.session, r.replace_transcript)
            if prompt.state is not None:
                r.prompt_id = self.commit(r.session, prompt.state, "prompt", r.head, r.unrecorded).id
                r.head, r.unrecorded = r.prompt_id, []
        except Exception as e:  # noqa: BLE001 - a snapshot failure must not lose the turn
            r.error = _reason(e)

    def turn(self, r: TurnRecord, done: TurnDone) -> None:
        """Record the reply snapshot and the reply (after `prompt`; without it, the prompt part too)."""
        if not r.prompted:
            self.prompt(r, done.prompt)
        finish = done.finish
        reply = {"role": "assistant", "content": finish.text, "finish_reason": finish.reason}
        unrecorded = r.unrecorded + [reply]
        if r.error is None:
            try:
                if done.reply_state is None:
                    raise ValueError("the turn captured no reply state")
                r.reply_id = self.commit(r.session, done.reply_state, "reply", r.head, unrecorded).id
                r.unrecorded, r.ended_at = [], time.perf_counter()
                return
            except Exception as e:  # noqa: BLE001 - a snapshot failure must not lose the turn
                r.error = _reason(e)
        log.error("session %s: could not snapshot the turn (%s); the transcript keeps it", r.session, r.error)
        try:
            self.store.transcripts.append(r.session, unrecorded)
            r.unrecorded = []
        except Exception as e2:  # noqa: BLE001
            log.error("session %s: could not record the transcript either: %s", r.session, e2)
            r.error = f"{r.error}; the transcript could not be recorded either ({_reason(e2)})"
        r.ended_at = time.perf_counter()

    def commit(
        self,
        session: str,
        state: SessionState,
        stage: str,
        parent: str | None = None,
        messages: list[dict] | None = None,
    ) -> SnapshotRecord:
        payload = to_payload(state, self.engine.spec, {"stage": stage})
        return self.store.snapshots.commit(session, payload, parent=parent, messages=messages)


def _reason(e: BaseException) -> str:
    """An error as one line for the turn's result and the log: its own message for ours."""
    return e.message if isinstance(e, EngramError) else f"{type(e).__name__}: {e}"
