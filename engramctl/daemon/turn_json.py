"""The fields every API reports about a turn, written once from a TurnResult (turn_result.py): the `engram`
object (protocol.TurnInfo: session, origin and restore, cached tokens, snapshot id, timings) and the
token usage. The OpenAI, Ollama, Engram, agent and WebSocket doors all put these in their own answers.
"""

from __future__ import annotations

from typing import Any

from engramctl.daemon.turn_result import TurnResult
from engramctl.protocol import TurnInfo


def _ms(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 2)


def turn_info(r: TurnResult) -> TurnInfo:
    """A turn's `engram` extension: its origin, and once it is recorded its outcome (finish_reason is the
    engine's: it says "cancelled")."""
    info = TurnInfo(
        session=r.session,
        resumed=r.resumed,
        restored_tokens=r.restored_tokens,
        tier=r.tier,
        restore_ms=r.restore_ms,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
        computed_tokens=r.computed_tokens,
        prefill_ms=round(r.prefill_ms, 2),
    )
    if not r.recorded:
        return info
    return TurnInfo(
        **{
            **info.to_json(),
            "snapshot_id": r.snapshot_id,
            "snapshot_error": r.snapshot_error,
            "finish_reason": r.finish_reason,
            "completion_tokens": r.completion_tokens,
            "ttft_ms": _ms(r.ttft_ms),
            "decode_ms": _ms(r.decode_ms),
        }
    )


def engram_json(r: TurnResult) -> dict[str, Any]:
    """The `engram` object: a stream's first chunk (the origin; the outcome's fields null), a finished turn."""
    return turn_info(r).to_json()


def usage_json(r: TurnResult) -> dict[str, Any]:
    return {
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "total_tokens": r.prompt_tokens + r.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
    }


def finish_reason(r: TurnResult) -> str | None:
    """OpenAI's (and Ollama's done_reason): "stop" | "length" (a cancelled reply was cut short, as by a
    length limit)."""
    return "length" if r.finish_reason == "cancelled" else r.finish_reason
