"""Restore-and-generate's turn: the Engram API's `continuation_ids` (token ids) fed to a restored state.

Their clients send the chat template's render of the new user message (with the generation prompt) as
token ids, not text. The turn is the service's like every other (ConversationService.plan_turn and
sequence: plan, then the scheduler prefills, generates, settles, records); what is theirs is here: the ids
checked against the vocabulary, and the user message they render recovered for the transcript
(`continuation_message`).
"""

from __future__ import annotations

from typing import Any, Callable

from engramctl.daemon.engram_api.restore import TurnFrom
from engramctl.daemon.job import Job
from engramctl.daemon.recorder import TurnRecord
from engramctl.daemon.sequence import Sequence
from engramctl.daemon.service import ConversationService, plain
from engramctl.daemon.state_cache import Origin
from engramctl.engine.backend import Live
from engramctl.engine.engine import Engine
from engramctl.engine.sampling_params import SamplingParams
from engramctl.engine.turn import Turn
from engramctl.errors import UsageError

_MARK = "ENGRAMCONTINUATIONMARK"


def token_turn(
    service: ConversationService,
    ids: list[int],
    params: SamplingParams,
    job: Job | None,
) -> TurnFrom:
    """The turn restore.restore runs from the restored state (its `then`): the state at the
    base's head (or its transcript, prefilled, when it has none) consumes `ids`, then the reply is generated.
    The transcript records the user message the ids render, as near as it can be told."""

    def run(
        name: str, base: tuple[list[dict], str | None], before_commit: Callable[[], Any] | None, t0: float
    ) -> Sequence:
        engine = service.engine
        transcript, head = base
        conversation = [plain(m) for m in transcript]
        if head is not None:
            live, origin = service.states.at_head(name, head)  # an unusable snapshot is an error, not a fallback
        else:
            live = service.states.from_transcript(conversation) if conversation else engine.new_live()
            origin = Origin()
        tok, budget = engine.tokenizer, service.default_max_tokens
        vocab = _vocab_size(engine, live)
        bad = next((t for t in ids if vocab is not None and t >= vocab), None)
        if bad is not None or not (ids or live.token_ids):
            service.states.give_back(live, origin)
            if bad is None:
                raise UsageError(f"continuation_ids is empty and session {name!r} has no state to continue from.")
            raise UsageError(f"continuation_ids: token id {bad} is not in the model's vocabulary (0-{vocab - 1}).")
        added = tok.decode(ids, skip_special=False)
        turn = service.plan_turn(
            live,
            origin,
            lambda: Turn.for_tokens(
                engine, live, list(live.token_ids) + list(ids), live.text + added, params, default_max_tokens=budget
            ),
        )
        new = [continuation_message(tok, conversation, added, ids)] if ids else []
        record = TurnRecord(name, origin.parent, new, before_commit=before_commit)
        return service.sequence(turn, name, origin, record, job, t0)

    return run


def _vocab_size(engine: Engine, live: Live) -> int | None:
    """How many token ids the model knows: its logits' width, else the tokenizer's size, else unknown."""
    if live.last_logits is not None:
        return int(live.last_logits.shape[-1])
    tok = engine.tokenizer
    n = getattr(tok, "n_vocab", None)
    if n is None and getattr(tok, "hf", None) is not None:
        n = len(tok.hf)
    return None if n is None else int(n)


def continuation_message(tok: Any, transcript: list[dict], text: str, ids: list[int]) -> dict[str, str]:
    """The user message that token ids added after `transcript` render, for the transcript: the chat
    template's render of a user message after that transcript (what token_delta feeds), or of a user
    message alone (what the Engram server's clients send), with `text` in its content's place; else the
    ids' plain text (special tokens left out)."""
    try:
        history = tok.render(transcript, add_generation_prompt=False) if transcript else ""
        after = tok.render(transcript + [{"role": "user", "content": _MARK}], add_generation_prompt=True)
        alone = tok.render([{"role": "user", "content": _MARK}], add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - no chat template, or one that cannot render this: the plain text
        history, after, alone = None, "", ""
    shapes = ([after[len(history) :]] if history is not None and after.startswith(history) else []) + [alone]
    for shape in shapes:
        head, mark, tail = shape.partition(_MARK)
        if mark and text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail):
            return {"role": "user", "content": text[len(head) : len(text) - len(tail)]}
    return {"role": "user", "content": tok.decode(ids, skip_special=True).strip()}
