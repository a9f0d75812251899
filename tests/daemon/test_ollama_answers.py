"""The objects of Ollama's API as the daemon builds them (daemon/ollama_answers.py), without a model."""

from __future__ import annotations

import json
from datetime import datetime

from engramctl.daemon.ollama_answers import Answer


def test_a_streamed_piece_line_is_the_piece_object():
    for chat in (True, False):
        answer = Answer("m", chat)
        for text in ("", "Hi", ' "q" \\ é 🙂\n'):
            line = answer.piece_line(text)
            assert line.endswith("\n") and "\n" not in line[:-1]  # one NDJSON line
            got, want = json.loads(line), answer.piece(text)
            assert list(got) == list(want)  # Ollama's fields, in its order
            assert {**got, "created_at": None} == {**want, "created_at": None}
            assert datetime.fromisoformat(got["created_at"].replace("Z", "+00:00")).tzinfo is not None
