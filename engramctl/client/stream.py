"""A streamed chat completion as the client reads it: text pieces, then the finish, usage and the
"engram" extension. Leaving it early (break, close(), Ctrl-C) disconnects, which cancels the generation.

The daemon sends the chunk with the finish_reason as soon as generation stops, and the turn's `engram`
object (its snapshot id) in a trailing chunk with no choices once the turn is recorded, then [DONE]
(daemon/streaming.py): the iteration ends at [DONE], so `.turn` has the snapshot id once it has."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import httpx

from engramctl.client.connection import error_from_body
from engramctl.errors import DaemonUnreachable
from engramctl.protocol import TurnInfo


class ChatStream:
    """A streamed completion. Iterate for text pieces; afterwards `.text`, `.finish_reason`, `.usage`
    and `.engram` (the first chunk's extension updated by every later one that has one: session, resumed,
    restored_tokens, tier, restore_ms, then snapshot_id, ... from the trailing chunk), read as a
    protocol.TurnInfo by `.turn`. `.finished` is set once the finish_reason has arrived, `.done` at [DONE].
    Usable as a context manager."""

    def __init__(self, cm, response: httpx.Response, broken: Callable[[str], Exception] = DaemonUnreachable):
        """`broken(what)`: the error for a connection that broke (Connection.broken: in words of the daemon's
        death where its watcher recorded one)."""
        self._cm, self._response, self._broken = cm, response, broken
        self.engram: dict[str, Any] = {}
        self.usage: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.finished = False  # the reply has ended (its snapshot id may still be on its way)
        self.id: str | None = None
        self.pieces: list[str] = []
        self.done = False

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def turn(self) -> TurnInfo:
        return TurnInfo.from_json(self.engram)

    def __iter__(self) -> Iterator[str]:
        try:
            for line in self._response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    self.done = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    raise error_from_body(500, obj)
                self.id = obj.get("id", self.id)
                if isinstance(obj.get("engram"), dict):
                    self.engram.update(obj["engram"])
                if obj.get("usage"):
                    self.usage = obj["usage"]
                for choice in obj.get("choices") or ():
                    if choice.get("finish_reason"):
                        self.finish_reason, self.finished = choice["finish_reason"], True
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        self.pieces.append(piece)
                        yield piece
        except httpx.HTTPError as e:
            raise self._broken(f"the connection to the daemon broke mid-stream ({e}).") from None
        finally:
            self.close()

    def close(self) -> None:
        """Disconnect (cancels the generation if it is still running)."""
        if self._cm is not None:
            cm, self._cm = self._cm, None
            cm.__exit__(None, None, None)

    def __enter__(self) -> "ChatStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
