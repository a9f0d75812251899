"""One turn's outcome, the one type every door reports from: `TurnResult`.

The engine ends a turn with its own outcome (engine/turn.py: `Prompt` once the prompt is in the state,
`Finish` when generation stops, `TurnDone` once the reply state is captured); the engine cannot import the
daemon, so it stays the engine's. The daemon turns it into a TurnResult here and only here, in the three
moments a stream reports:

    started(...)    the prompt is in the state: where the state came from, what the prompt cost
    finished(...)   generation stopped: the reply, its finish reason, its timings (the stream's last choice)
    recorded(...)   the reply state is captured and recorded: its snapshot, or why there is none

Each is the previous one with more fields set, so a door reads one type whatever moment it answers at.
The fields every API reports about a turn (the `engram` object, usage) are written by turn_json.py;
each wire format's own objects by its door (streaming.py: OpenAI; ollama_answers.py; the Engram API's
answers.py; agent_socket.py; dispatch.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engramctl.daemon.recorder import TurnRecord
from engramctl.daemon.state_cache import Origin
from engramctl.engine.generate import Finish
from engramctl.engine.logprobs import TokenLogprob
from engramctl.engine.turn import Prompt, TurnDone


@dataclass(frozen=True)
class TurnResult:
    """A turn of `session`. Times are milliseconds; `*_at` marks are time.perf_counter() values."""

    session: str
    started_at: float  # the worker took the request
    # where the state came from (state_cache.Origin)
    tier: str | None  # "live" | "vram" | "ram" | "disk" | None (a fresh state)
    restored_tokens: int
    restore_ms: float | None
    # the prompt (engine Prompt)
    prompt_tokens: int  # tokens of the conversation so far
    computed_tokens: int  # run through the model this turn
    reset: bool  # the chat template was not prefix-stable: the state started over
    prefill_ms: float
    # the reply: set once generation stops (finish_reason None before)
    finish_reason: str | None = None  # the engine's: "stop" | "length" | "cancelled"
    text: str = ""  # the reply as shown
    token_ids: tuple[int, ...] = ()  # every generated token, EOS included
    logprobs: tuple[TokenLogprob, ...] = ()  # with the request's logprobs: one entry per reply token
    first_token_at: float | None = None
    last_token_at: float | None = None
    decode_ms: float | None = None
    # the reply state: set once it is captured
    settle_ms: float | None = None
    capture_ms: float | None = None
    context: tuple[int, ...] = ()  # the token ids the reply state holds (Ollama's generate answers them)
    # the record: set once recorded
    recorded: bool = False
    snapshot_id: str | None = None  # the reply snapshot, the session's new head (None: snapshotting failed)
    prompt_snapshot_id: str | None = None  # None: nothing was computed for the prompt, or it failed
    snapshot_error: str | None = None  # why the turn has no snapshot; the transcript has the turn anyway
    record_started_at: float | None = None
    recorded_at: float | None = None

    @property
    def resumed(self) -> bool:
        return self.restored_tokens > 0

    @property
    def cached_tokens(self) -> int:
        return self.prompt_tokens - self.computed_tokens

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def ttft_ms(self) -> float | None:
        """From the worker taking the request to the first sampled token."""
        return None if self.first_token_at is None else (self.first_token_at - self.started_at) * 1000

    @property
    def record_ms(self) -> float | None:
        """Committing the snapshots and the transcript."""
        if self.record_started_at is None or self.recorded_at is None:
            return None
        return (self.recorded_at - self.record_started_at) * 1000


def started(session: str, origin: Origin, prompt: Prompt, started_at: float) -> TurnResult:
    tier, restore_ms = origin.tier, origin.restore_ms
    if origin.hot and prompt.loaded is not None:
        # a hot state the backend had parked, loaded back in the prefill's steps: that load is its restore, and
        # one from a device copy (llama.cpp's VRAM tier) came from VRAM
        tier = "vram" if prompt.loaded[0] == "device" else tier
        restore_ms = round(prompt.loaded[1], 2)
    return TurnResult(
        session=session,
        started_at=started_at,
        tier=tier,
        restored_tokens=origin.restored_tokens,
        restore_ms=restore_ms,
        prompt_tokens=prompt.prompt_tokens,
        computed_tokens=prompt.computed_tokens,
        reset=prompt.reset,
        prefill_ms=prompt.prefill_ms,
    )


def finished(r: TurnResult, finish: Finish) -> TurnResult:
    return dataclasses.replace(
        r,
        finish_reason=finish.reason,
        text=finish.text,
        token_ids=finish.token_ids,
        logprobs=finish.logprobs,
        first_token_at=finish.first_token_at,
        last_token_at=finish.ended_at,
        decode_ms=finish.decode_s * 1000,
    )


def recorded(r: TurnResult, done: TurnDone, record: TurnRecord) -> TurnResult:
    """`r` (started, or already finished) once the turn `done` is recorded as `record` says."""
    if r.finish_reason is None:
        r = finished(r, done.finish)
    return dataclasses.replace(
        r,
        last_token_at=done.last_token_at,
        settle_ms=done.settle_ms,
        capture_ms=done.capture_ms,
        context=tuple(done.live.token_ids),
        recorded=True,
        snapshot_id=record.reply_id,
        prompt_snapshot_id=record.prompt_id,
        snapshot_error=record.error,
        record_started_at=record.started_at,
        recorded_at=record.ended_at,
    )
